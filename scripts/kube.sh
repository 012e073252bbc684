#!/usr/bin/env bash
# Builds the Kubernetes binaries the cluster tests, the conformance run and
# the benchmarks use, once, from the published k8s.io/kubernetes module on
# the Go module proxy, and caches them under
# /var/cache/village/kubernetes-<version>/ (VILLAGE_CACHE overrides the
# root). One `go build` builds every missing command, so they share the
# compile of the common packages; e2e.test is a test binary (`go test -c`)
# and follows it, reusing the same build cache. CoreDNS (cluster DNS for the
# Services conformance tests) is built from its own module into the same
# directory. ginkgo is the Ginkgo CLI at the version k8s.io/kubernetes'
# go.mod requires: e2e.test is a compiled Ginkgo suite, and only the CLI runs
# it in parallel processes (scripts/conformance.sh, test/kube's conformance
# run).
#
# Usage: scripts/kube.sh [component...]   (default: all of them)
# Components: kube-apiserver kube-controller-manager kube-scheduler kubelet
#             kube-proxy kubectl e2e.test agnhost coredns ginkgo
# Prints the cache directory. Skips everything already there.
#
# The module's go.mod points the k8s.io/* staging modules at ./staging, which
# the module zip does not contain: those replaces are dropped and the
# published v0.x of the same release is used instead.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

VERSION="${KUBE_VERSION:-v1.37.2}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
CACHE="${VILLAGE_CACHE:-/var/cache/village}"
OUT="$CACHE/kubernetes-$VERSION"
# One build at a time: a second caller waits for the first and then finds
# everything built (several test runs on one machine share the cache).
if [ -z "${VILLAGE_KUBE_SH_LOCKED:-}" ]; then
  mkdir -p "$CACHE"
  exec env VILLAGE_KUBE_SH_LOCKED=1 flock "$CACHE/.kube.sh.lock" "$0" "$@"
fi

all=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl e2e.test agnhost coredns ginkgo)
want=("$@")
[ "${#want[@]}" -gt 0 ] || want=("${all[@]}")

declare -A pkg=(
  [kube-apiserver]=./cmd/kube-apiserver
  [kube-controller-manager]=./cmd/kube-controller-manager
  [kube-scheduler]=./cmd/kube-scheduler
  [kubelet]=./cmd/kubelet
  [kube-proxy]=./cmd/kube-proxy
  [kubectl]=./cmd/kubectl
  [agnhost]=./test/images/agnhost
)

missing=() e2e=0 dns=0 gk=0
for c in "${want[@]}"; do
  case "$c" in
    e2e.test) [ -x "$OUT/e2e.test" ] || e2e=1 ;;
    coredns) [ -x "$OUT/coredns" ] || dns=1 ;;
    ginkgo) [ -x "$OUT/ginkgo" ] || gk=1 ;;
    *)
      [ -n "${pkg[$c]:-}" ] || { echo "kube.sh: unknown component $c (one of: ${all[*]})" >&2; exit 2; }
      [ -x "$OUT/$c" ] || missing+=("$c")
      ;;
  esac
done
# agnhost's porter serves TLS with the test certificate beside its source;
# the conformance image takes it from here.
certs=0
[[ " ${want[*]} " == *" agnhost "* ]] && [ ! -f "$OUT/porter/localhost.key" ] && certs=1
if [ "${#missing[@]}" -eq 0 ] && [ "$e2e" = 0 ] && [ "$dns" = 0 ] && [ "$gk" = 0 ] && [ "$certs" = 0 ]; then
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$OUT"

# modsrc MODULE VERSION DIR: a writable copy of a module's source.
modsrc() {
  mkdir -p "$work/fetch-$1"
  (cd "$work/fetch-$1" && go mod init fetch >/dev/null 2>&1 && go mod download -json "$2@$3" >"$work/dl-$1.json")
  local dir
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/dl-$1.json")"
  [ -d "$dir" ] || { echo "kube.sh: download of $2@$3 failed" >&2; exit 1; }
  cp -r "$dir" "$4"
  chmod -R u+w "$4"
}

if [ "${#missing[@]}" -gt 0 ] || [ "$e2e" = 1 ] || [ "$gk" = 1 ]; then
  echo "kube.sh: building ${missing[*]} $([ "$e2e" = 1 ] && echo e2e.test) $([ "$gk" = 1 ] && echo ginkgo) $VERSION (slow, once) into $OUT" >&2
  src="$work/kubernetes"
  modsrc k8s k8s.io/kubernetes "$VERSION" "$src"
  staging="v0.${VERSION#v1.}"   # v1.37.2 -> v0.37.2
  (
    cd "$src"
    sed -i -E '/=> \.\/staging\//d' go.mod
    sed -i -E "s#^(\s*k8s\.io/[A-Za-z0-9._/-]+) v0\.0\.0\$#\1 $staging#" go.mod
    mkdir -p "$work/bin"
    if [ "${#missing[@]}" -gt 0 ]; then
      pkgs=()
      for c in "${missing[@]}"; do pkgs+=("${pkg[$c]}"); done
      nice -n 10 go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$VERSION -X k8s.io/client-go/pkg/version.gitVersion=$VERSION" -o "$work/bin/" "${pkgs[@]}"
    fi
    if [ "$e2e" = 1 ]; then
      nice -n 10 go test -c -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$VERSION" -o "$work/bin/e2e.test" ./test/e2e
    fi
    if [ "$gk" = 1 ]; then
      # The CLI's package at the Ginkgo version this go.mod requires.
      nice -n 10 go build -trimpath -ldflags "-s -w" -o "$work/bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
    fi
  )
  for f in "$work/bin"/*; do
    install -m 0755 "$f" "$OUT/.$(basename "$f").tmp"
    mv "$OUT/.$(basename "$f").tmp" "$OUT/$(basename "$f")"
  done
fi

if [ "$certs" = 1 ]; then
  mkdir -p "$work/fetch-certs"
  dir="$(cd "$work/fetch-certs" && go mod init fetch >/dev/null 2>&1 && go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -f "$dir/test/images/agnhost/porter/localhost.key" ] || { echo "kube.sh: no porter certificate in k8s.io/kubernetes@$VERSION" >&2; exit 1; }
  mkdir -p "$OUT/porter"
  install -m 0644 "$dir/test/images/agnhost/porter/localhost.crt" "$dir/test/images/agnhost/porter/localhost.key" "$OUT/porter/"
fi

if [ "$dns" = 1 ]; then
  echo "kube.sh: building coredns $COREDNS_VERSION into $OUT" >&2
  modsrc coredns github.com/coredns/coredns "$COREDNS_VERSION" "$work/coredns"
  (cd "$work/coredns" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$work/coredns.bin" .)
  install -m 0755 "$work/coredns.bin" "$OUT/.coredns.tmp"
  mv "$OUT/.coredns.tmp" "$OUT/coredns"
fi
echo "$OUT"
