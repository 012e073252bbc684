#!/usr/bin/env bash
# Prints the path of the cached kube-apiserver that internal/kubetest runs
# (the registry and LAN-pool tests), building it first if needed: it is one of
# the Kubernetes binaries scripts/kube.sh builds and caches by version.
set -euo pipefail
dir="$("$(dirname "$0")/kube.sh" kube-apiserver)"
echo "$dir/kube-apiserver"
