#!/usr/bin/env bash
# Builds every Village binary into ./bin (static, -trimpath, version stamped),
# plus ./bin/cnitool and the reference plugins into ./bin/ref (from the Go
# module cache, at the versions go.mod pins) for the demo, tests and benchmarks.
#
#   ./build_linux.sh              # binaries for this machine, in ./bin
#   ./build_linux.sh -arch arm64  # binaries for linux/arm64 in ./bin/linux-arm64
#                                 # (amd64, arm64, arm/v7 (or arm), all; repeatable)
#   ./build_linux.sh image        # binaries for this machine and the three
#                                 # platforms, then the DaemonSet's image as one
#                                 # OCI image index of linux/amd64, linux/arm64
#                                 # and linux/arm/v7, bin/village-image.tar (same
#                                 # bytes for the same commit; ctr images import /
#                                 # podman load pick the machine's platform). Each
#                                 # platform's iptables comes from Debian's
#                                 # packages (apt-get download, cached in
#                                 # /var/cache/village/debs).
set -euo pipefail
cd "$(dirname "$0")"

VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
LDFLAGS="-s -w -X github.com/village-cni/village/pkg/buildinfo.Version=${VERSION}"
export CGO_ENABLED=0

PLATFORMS=(linux/amd64 linux/arm64 linux/arm/v7)
image=0 arches=()
while [ $# -gt 0 ]; do
  case "$1" in
    image) image=1 ;;
    -arch) shift; case "${1:-}" in
        all) arches+=("${PLATFORMS[@]}") ;;
        amd64|arm64) arches+=("linux/$1") ;;
        arm|arm/v7) arches+=(linux/arm/v7) ;;
        *) echo "build_linux.sh: -arch ${1:-}: want amd64, arm64, arm/v7 or all" >&2; exit 2 ;;
      esac ;;
    *) echo "usage: build_linux.sh [-arch amd64|arm64|arm/v7|all]... [image]" >&2; exit 2 ;;
  esac
  shift
done
[ "$image" = 1 ] && arches=("${PLATFORMS[@]}")

pkgs=(./plugins/...)
[ -d cmd ] && pkgs+=(./cmd/...)
# build DIR: every binary into DIR and the reference ones into DIR/ref, for
# the GOARCH/GOARM in the environment.
build() {
  mkdir -p "$1/ref"
  # grpcnotrace: no golang.org/x/net/trace (and so no html/template) in the
  # binaries that link the etcd client; internal/testenv.BuildTags says why.
  go build -trimpath -tags grpcnotrace -ldflags "$LDFLAGS" -o "$1/" "${pkgs[@]}"
  # cnitool and the reference plugins (bridge, host-local, portmap, ...) are go
  # "tool" dependencies; build them side by side for comparison and chaining.
  go build -trimpath -ldflags "-s -w" -o "$1/ref/" tool
  cp "$1/ref/cnitool" "$1/cnitool"
}
build bin
echo "built $(ls bin | grep -v -e '^ref$' -e '\.tar$' -e '^linux-' | tr '\n' ' ')(version ${VERSION}); reference plugins in bin/ref"
for p in "${arches[@]}"; do
  arch=${p#linux/}; arch=${arch%/v7}
  dir="bin/${p//\//-}"
  GOOS=linux GOARCH="$arch" GOARM=7 build "$dir"
  echo "built $p into $dir"
done

if [ "$image" = 1 ]; then
  # The commit's time as the image's creation time and every file's mtime:
  # the same commit gives the same bytes.
  SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}" \
    go run -trimpath ./internal/ociimage/mkimage -bin bin -o bin/village-image.tar \
    -platforms "$(IFS=,; echo "${PLATFORMS[*]}")"
  sha256sum bin/village-image.tar
fi
