#!/usr/bin/env bash
# Builds every Village binary into ./bin (static, -trimpath, version stamped),
# plus ./bin/cnitool and the reference plugins into ./bin/ref (from the Go
# module cache, at the versions go.mod pins) for the demo, tests and benchmarks.
#
#   ./build_linux.sh          # binaries
#   ./build_linux.sh image    # binaries, then the DaemonSet's image as an OCI
#                             # archive, bin/village-image.tar (same bytes for
#                             # the same commit; ctr images import / podman load)
set -euo pipefail
cd "$(dirname "$0")"

VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
LDFLAGS="-s -w -X github.com/village-cni/village/pkg/buildinfo.Version=${VERSION}"
export CGO_ENABLED=0

mkdir -p bin bin/ref
pkgs=(./plugins/...)
[ -d cmd ] && pkgs+=(./cmd/...)
# grpcnotrace: no golang.org/x/net/trace (and so no html/template) in the
# binaries that link the etcd client; internal/testenv.BuildTags says why.
go build -trimpath -tags grpcnotrace -ldflags "$LDFLAGS" -o bin/ "${pkgs[@]}"
# cnitool and the reference plugins (bridge, host-local, portmap, ...) are go
# "tool" dependencies; build them side by side for comparison and chaining.
go build -trimpath -ldflags "-s -w" -o bin/ref/ tool
cp bin/ref/cnitool bin/cnitool
echo "built $(ls bin | grep -v -e '^ref$' -e '\.tar$' | tr '\n' ' ')(version ${VERSION}); reference plugins in bin/ref"

if [ "${1:-}" = image ]; then
  # The commit's time as the image's creation time and every file's mtime:
  # the same commit gives the same bytes.
  SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}" \
    go run -trimpath ./internal/ociimage/mkimage -bin bin -o bin/village-image.tar
  sha256sum bin/village-image.tar
fi
