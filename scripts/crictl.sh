#!/usr/bin/env bash
# Prints the path of a crictl binary built from the Go module proxy at
# CRICTL_VERSION (default v1.34.0; Debian 12 has no crictl package and
# v1.28.0 is refused by the module proxy). The binary is cached under
# /var/cache/village/crictl-<version>/ (VILLAGE_CACHE overrides the root), so
# CI and the tests build it once per machine.
set -euo pipefail
version="${CRICTL_VERSION:-v1.34.0}"
cache="${VILLAGE_CACHE:-/var/cache/village}/crictl-${version}"
if [ ! -x "$cache/crictl" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "crictl.sh: building sigs.k8s.io/cri-tools/cmd/crictl@${version} into $cache" >&2
  GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/cri-tools/cmd/crictl@${version}" >&2
  mv "$tmp/crictl" "$cache/crictl"
fi
echo "$cache/crictl"
