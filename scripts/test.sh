#!/usr/bin/env bash
# Runs every test: vet, the unit and namespace tests, and the end-to-end tests
# through libcni and cnitool with the built binaries. Every fuzz target's seed
# corpus (f.Add and testdata/fuzz) runs in `go test` as an ordinary test; fuzzing
# itself (random inputs for a while) is scripts/fuzz.sh, kept out of this
# command because Go's fuzzing engine can fail on a loaded machine for
# reasons that are not defects ("context deadline exceeded" from a slow
# worker). Needs root (tests make network namespaces) and the packages
# scripts/deps.sh installs (it runs first).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (tests make network namespaces)" >&2; exit 1; }

export PATH="$PATH:/usr/local/go/bin"
./scripts/deps.sh
# crictl for the containerd test (test/runtime): built once from the module
# proxy and cached under /var/cache/village.
./scripts/crictl.sh >/dev/null

echo "== go vet"
go vet ./...
# test/libcni-v1.1 is its own module (pinned to libcni 1.1.2): ./... skips it.
(cd test/libcni-v1.1 && go vet ./...)
# test/helm is its own module too (helm.sh/helm/v4 stays out of the main go.mod).
(cd test/helm && go vet ./...)

echo "== build"
./build_linux.sh
export VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref"

echo "== Kubernetes binaries for the API and cluster tests (built once per version, cached)"
VILLAGE_KUBE_DIR="$(./scripts/kube.sh)"
VILLAGE_KUBE_APISERVER="$VILLAGE_KUBE_DIR/kube-apiserver"
export VILLAGE_KUBE_DIR VILLAGE_KUBE_APISERVER

echo "== go test"
# Everything but the Kubernetes cluster tests, packages two at a time.
go test -count=1 -timeout 60m $(go list ./... | grep -v '/test/kube$') 2>&1 | tee /tmp/village-test.log

echo "== go test in test/helm (the Helm chart, with Helm's Go library)"
(cd test/helm && go test -count=1 ./...) 2>&1 | tee -a /tmp/village-test.log

echo "== go test ./test/kube (Kubernetes clusters: kubelet, kube-proxy, the shipped DaemonSet)"
# Alone, after the rest: each cluster is a dozen processes on two cores.
go test -count=1 -timeout 45m ./test/kube/ 2>&1 | tee -a /tmp/village-test.log

echo "== all tests passed"
