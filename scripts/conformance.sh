#!/usr/bin/env bash
# Runs the upstream sig-network conformance suite (e2e.test of Kubernetes
# v1.37.2) against a two-node cluster with Village installed from
# deploy/kubernetes, once with kube-proxy in iptables mode and once in
# nftables mode (test/kube/conformance_test.go), and prints the
# passed / failed / skipped table of each.
#
# Usage (as root): scripts/conformance.sh [granular|full|netpol|dualstack]   (default: full)
#   granular: [sig-network] Networking Granular Checks (pods and Services) and
#             five tests of [sig-network] Netpol (what the test command runs)
#   full:     those, every [sig-network] [Conformance] test and the whole
#             [sig-network] Netpol suite (NetworkPolicy)
#   netpol:   the [sig-network] Netpol suite alone
#   dualstack: the [sig-network] [Feature:IPv6DualStack] tests, on a dual-stack
#             cluster (IPv4 and IPv6 pod and Service ranges, nodes with an
#             address per family; kubecluster.Options.DualStack)
# VILLAGE_CONFORMANCE_PROCS: Ginkgo processes (default 3).
# Builds what it needs first: the binaries and the DaemonSet image
# (./build_linux.sh image) and the Kubernetes binaries, e2e.test, agnhost,
# CoreDNS and the Ginkgo CLI (scripts/kube.sh, cached per version).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "conformance.sh: run as root (the cluster lives in network namespaces)" >&2; exit 1; }
export PATH="$PATH:/usr/local/go/bin"

set_="${1:-full}"
case "$set_" in granular|full|netpol|dualstack) ;; *) echo "conformance.sh: unknown set $set_ (granular, full, netpol or dualstack)" >&2; exit 2 ;; esac

./scripts/deps.sh
./build_linux.sh image
VILLAGE_KUBE_DIR="$(./scripts/kube.sh)"
export VILLAGE_KUBE_DIR VILLAGE_KUBE_APISERVER="$VILLAGE_KUBE_DIR/kube-apiserver"
export VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref"
export VILLAGE_CONFORMANCE="$set_"

log="$(mktemp /tmp/village-conformance.XXXXXX.log)"
echo "== conformance ($set_), kube-proxy iptables and nftables; log: $log"
rc=0
go test -count=1 -timeout 150m -run '^TestConformance$' -v ./test/kube/ >"$log" 2>&1 || rc=$?
# The tables, the timings and every failure with its message.
grep -E '^\s+conformance_test.go:[0-9]+: (conformance|FAILED)|^\s*\| |^\s*skipped: |^--- |^=== RUN|^(ok|FAIL)\s' "$log" || true
[ "$rc" = 0 ] && echo "== conformance passed" || echo "== conformance FAILED (exit $rc); details in $log"
exit "$rc"
