#!/usr/bin/env bash
# Builds flanneld (the control-plane benchmark's comparison, `scripts/bench.sh
# -only flannel`) once from the published github.com/flannel-io/flannel module
# on the Go module proxy and caches it under
# /var/cache/village/flannel-<version>/flanneld (VILLAGE_CACHE overrides the
# root). Prints the binary's path. FLANNEL_GOARCH=arm64 (or arm, with GOARM=7)
# cross-builds it into /var/cache/village/flannel-<version>-<goarch>/ instead
# (the arm footprint benchmark, test/armvm).
#
# The module's main.go imports two backends that cannot be built here: the
# tencentvpc backend, whose SDK version the proxy refuses, and the udp
# backend, which needs cgo. A copy of the module with those two blank imports
# removed builds with CGO_ENABLED=0; the vxlan and host-gw backends the
# benchmark runs are untouched.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

VERSION="${FLANNEL_VERSION:-v0.28.10}"
CACHE="${VILLAGE_CACHE:-/var/cache/village}"
GOARCH_="${FLANNEL_GOARCH:-}"
OUT="$CACHE/flannel-$VERSION${GOARCH_:+-$GOARCH_}"
if [ -x "$OUT/flanneld" ]; then
  echo "$OUT/flanneld"
  exit 0
fi
mkdir -p "$OUT"
dir=$(cd /tmp && go mod download -json "github.com/flannel-io/flannel@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "flannel.sh: go mod download of flannel $VERSION gave no directory" >&2; exit 1; }
src="$OUT/src"
rm -rf "$src"
cp -r "$dir" "$src"
chmod -R u+w "$src"
sed -i -e '/pkg\/backend\/tencentvpc"/d' -e '/pkg\/backend\/udp"/d' "$src/main.go"
if grep -qE 'backend/(tencentvpc|udp)"' "$src/main.go"; then
  echo "flannel.sh: could not drop the tencentvpc and udp imports from main.go" >&2
  exit 1
fi
(cd "$src" && GOFLAGS=-mod=mod CGO_ENABLED=0 GOARCH="${GOARCH_:-$(go env GOARCH)}" GOARM=7 go build -trimpath -o "$OUT/flanneld.tmp" . >&2)
mv "$OUT/flanneld.tmp" "$OUT/flanneld"
echo "$OUT/flanneld"
