#!/usr/bin/env bash
# Builds MetalLB's speaker and controller (go.universe.tf/metallb, from the
# Go module proxy) for the side-by-side LAN Services benchmark (issue 39),
# cached by version like scripts/kube.sh caches Kubernetes, and prints the
# directory holding them.
#
# One change to MetalLB, recorded here: v0.16.2 requires
# github.com/metallb/frr-k8s v0.0.27, which the module proxy refuses
# ("This module version is not available"); v0.0.26 is served but lacks
# the AS-path-prepend advertisement of the frr-k8s BGP mode. The build
# replaces frr-k8s by v0.0.26 and drops those three uses from
# internal/bgp/frrk8s (BGP through frr-k8s only; L2 mode, the one the
# benchmark runs, does not reach that code).
set -euo pipefail
VERSION="${METALLB_VERSION:-v0.16.2}"
OUT="${METALLB_CACHE:-/var/cache/village}/metallb-$VERSION"
if [ -x "$OUT/speaker" ] && [ -x "$OUT/controller" ]; then echo "$OUT"; exit 0; fi
export PATH="$PATH:/usr/local/go/bin"
src=$(go mod download -json "go.universe.tf/metallb@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "metallb.sh: go.universe.tf/metallb@$VERSION not downloaded" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/" && chmod -R u+w "$work"
cd "$work"
go mod edit -replace github.com/metallb/frr-k8s=github.com/metallb/frr-k8s@v0.0.26
f=internal/bgp/frrk8s/frrk8s.go
sed -i '/PrefixesWithAsPathPrepend: make(\[\]frrv1beta1.AsPathPrependPrefixes, 0),/d;
        /neighbor.ToAdvertise.PrefixesWithAsPathPrepend = toAdvertiseWithAsPathPrepend(prefixesForAsPathPrepend)/d' "$f"
sed -i '/^func toAdvertiseWithAsPathPrepend/,/^}/d' "$f"
# The map it filled is now written and never read: keep Go's vet quiet.
sed -i 's/^\(\t*\)prefixesForAsPathPrepend\[adv.AsPathPrepend\] = append(prefixesForAsPathPrepend\[adv.AsPathPrepend\], prefix)/&\n\1_ = prefixesForAsPathPrepend/' "$f"
mkdir -p "$OUT.tmp"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$OUT.tmp/speaker" ./speaker >&2
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$OUT.tmp/controller" ./controller >&2
cp config/manifests/metallb-native.yaml "$OUT.tmp/"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT"
