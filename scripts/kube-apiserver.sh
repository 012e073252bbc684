#!/usr/bin/env bash
# Builds kube-apiserver once for the tests that run a real API server
# (internal/kubetest) and caches it under /var/cache/village, keyed on the
# version. Skips the build when the binary is already there. Needs only Go and
# the Go module proxy: the source comes from the published k8s.io/kubernetes
# module, whose go.mod points the k8s.io/* staging modules at ./staging; those
# replaces are dropped and the published v0.x of the same release used instead.
# Prints the binary's path.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

VERSION="${KUBE_APISERVER_VERSION:-v1.37.2}"
CACHE="${VILLAGE_CACHE:-/var/cache/village}"
OUT="$CACHE/kube-apiserver-$VERSION"
BIN="$OUT/kube-apiserver"

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

staging="v0.${VERSION#v1.}"   # v1.37.2 -> v0.37.2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod GOWORK=off GOTOOLCHAIN=local

echo "kube-apiserver.sh: building kube-apiserver $VERSION (slow, once) into $OUT" >&2
mkdir -p "$work/fetch"
(cd "$work/fetch" && go mod init fetch >/dev/null 2>&1 && go mod download -json "k8s.io/kubernetes@$VERSION" >"$work/dl.json")
dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/dl.json")"
[ -d "$dir" ] || { echo "kube-apiserver.sh: download of k8s.io/kubernetes@$VERSION failed" >&2; exit 1; }

src="$work/src"
cp -r "$dir" "$src"
chmod -R u+w "$src"
cd "$src"
# Drop "k8s.io/x => ./staging/..." replaces (single-line and inside a block),
# then pin the v0.0.0 staging requirements to the published release.
sed -i -E '/=> \.\/staging\//d' go.mod
sed -i -E "s#^(\s*k8s\.io/[A-Za-z0-9._/-]+) v0\.0\.0\$#\1 $staging#" go.mod
CGO_ENABLED=0 nice -n 10 go build -trimpath -o "$work/kube-apiserver" ./cmd/kube-apiserver

mkdir -p "$OUT"
install -m 0755 "$work/kube-apiserver" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
