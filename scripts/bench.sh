#!/usr/bin/env bash
# Village vs the reference plugins (bridge + host-local v1.10.0), side by side
# through ./bin/cnitool in throwaway node namespaces. Run as root. Builds
# everything, then runs bench/cmd/cnibench, which alternates the two suites
# (A B A B) and prints a Markdown table of medians and ratios (see
# docs/performance.md). It touches only namespaces it makes (named
# cnib<pid>-*) and temp directories, and removes them when it ends. The
# backends section compares ADD/DEL per ipMasqBackend (iptables, nftables) with
# the reference's same backend, and times Village's per-ADD netfilter
# verification in-process (the masquerade rows with the same backend on both
# sides). The datapath section compares pod-to-pod TCP throughput (iperf3)
# and request/response rate (bench/cmd/tcprr) across two nodes for host-gw,
# vxlan and auto against the underlay and hand-built devices. Every row
# says the 1-minute load average when taken. The runtime row starts one private containerd per suite inside those namespaces
# (internal/crienv) and times RunPodSandbox/StopPodSandbox over CRI.
#
#   ./scripts/bench.sh                 # everything, a few minutes on 2 cores
#   ./scripts/bench.sh -only latency   # one section (latency,backends,burst,scale,memory,overlay,throughput,datapath,runtime)
#   ./scripts/bench.sh -only masqoff   # only ADD/DEL with ipMasq off, round by round (below)
#   ./scripts/bench.sh -v              # also every sample series
#   ./scripts/bench.sh -only kube      # only the kubernetes registry at scale (below)
#   ./scripts/bench.sh -only kubelet   # only pod start under a real kubelet (below)
#   ./scripts/bench.sh -only lan       # only a pod's ADD by LAN address source (below)
#   ./scripts/bench.sh -only flannel   # only the control plane against flanneld (below)
#   ./scripts/bench.sh -only netpol    # only NetworkPolicy's costs (below)
#   ./scripts/bench.sh -only drops     # only NetworkPolicy drop logging's costs (below)
#   ./scripts/bench.sh -only lansvc    # only LAN Service address failover (below)
#   ./scripts/bench.sh -only lansvc-kube # the same through a real kubelet cluster (below)
#   ./scripts/bench.sh -only wireguard # only the wireguard backend against vxlan (below)
#   ./scripts/bench.sh -only armvm     # only villaged against flanneld's idle RSS on arm64 (below)
#
# The masqoff section (only with -only masqoff, ~3 minutes on 2 cores) is
# sequential ADD then DEL with ipMasq off, each followed by the exec floor,
# in 5 rounds (-masqoff-rounds) of 30 pods per suite (-seq) on fresh pods,
# the first suite swapping every round (A B, B A, ...) and every pod. It
# prints each round's medians and ratios with the uptime load averages at
# its start and end, and a row with the median of the rounds' ratios and
# their spread (min-max): one round on a load spike shows as an outlier,
# not as the figure.
#
# The kube section (also run after the others when no -only is given) is
# BenchmarkAgentKubeScale in test/e2e: one villaged watching a real
# kube-apiserver (scripts/kube-apiserver.sh) while 1,000 Node objects are
# created, then idle, then 100 of them changed at once; and
# BenchmarkAgentKubeWatches: the watches one agent holds on the API server.
#
# The kubelet section (only with -only kubelet: ~20 minutes) is
# BenchmarkKubeletPodStart in test/kube: one internal/kubecluster node, the CNI
# swapped between Village's DaemonSet and the reference bridge + host-local
# (A B A B), 30 pods one at a time and 110 at once (maxPods 120 beside the
# DaemonSet pod), creation to Ready. VILLAGE_KUBELET_BENCH_ROUNDS=1 halves it.
#
# The lan section (also only with -only) is BenchmarkLANAddressSource in
# test/e2e: a pod's ADD without a LAN interface, with one from a village-ipam
# pool, and with one leased from dnsmasq in the LAN through villaged's DHCP
# client (a full DISCOVER..ACK per ADD).
#
# The flannel section (only with -only flannel) is
# BenchmarkControlPlaneVsFlannel in test/e2e: villaged and flanneld
# (scripts/flannel.sh builds it) watching one kube-apiserver, vxlan then
# host-gw, while 1,000 Nodes are created ($VILLAGE_BENCH_NODES=1000,5000 for
# both sizes), 100 changed and 100 deleted; per-event latency to the kernel,
# CPU, RSS and API requests of each. Then an idle phase ($VILLAGE_BENCH_IDLE,
# default 6m30s: it holds one of villaged's safety-net passes, which it
# reports), CPU per minute of each; then objects deleted by hand in each
# node namespace, one at a time ($VILLAGE_BENCH_REPAIRS samples per kind,
# default 20): a route, a neighbour, an FDB entry, the masquerade table,
# and the VTEP, each one's return timed ("never" after 30 s); 1,000 routes
# deleted at once; the masquerade table deleted ten times a second for
# $VILLAGE_BENCH_STORM (default 60s), villaged's CPU over it. About 10
# minutes a round with a 30 s storm (40 minutes for both sizes on 2 cores).
#
# The netpol section (only with -only netpol, ~3 minutes) is the pkg/netpol
# benchmarks at 100 policies / 1,000 pods (a change from compile to kernel,
# whole table against the difference; iperf3 pod to pod with and without the
# policies) and BenchmarkNetpolAdd in test/e2e (ADD with the controller off
# and on), each row with the load average; then BenchmarkNetpolAgent (a real
# villaged and kube-apiserver with 1,000 Pods and 100 policies: RSS, policy
# update in the API to its rule in the kernel).
#
# The drops section (only with -only drops, ~3 minutes) is the
# pkg/netpol/drops benchmarks, each in a test node whose tables Compile
# makes, with the agent's NFLOG listener (drops.Run) in a process of its
# own: BenchmarkDropLatency (a denied datagram to its line in the built
# `villaged drops --json`, polled back to back, 20 drops), BenchmarkDropFlood
# (denied UDP from one sender per CPU for $VILLAGE_FLOOD_SECONDS, default
# 10: the rate reached, every datagram counted, the listener's CPU beside
# its idle CPU) and BenchmarkDropLogging (allowed traffic to a pod a policy
# isolates and admits the client to, on one node and across two nodes,
# drop logging on and off alternated on off on off: the same tables with
# the log rules deleted; each step TCP_RR then iperf3, 5 s each). FIGURE
# lines, each with the load.
#
# The lansvc section (only with -only lansvc, ~1 minute) is
# BenchmarkFailover in pkg/lansvc/speaker: three in-process agents in node
# namespaces on a LAN bridge, one Service address; the owner's uplink is
# pulled $VILLAGE_LANSVC_KILLS times (default 20) and replugged, a client
# asking every 10 ms; p50/p99 of failover and return, with the load.
#
# The lansvc-kube section (only with -only lansvc-kube, 30-60 minutes) is
# BenchmarkLANServicesKube in test/kube: a two-node internal/kubecluster
# cluster with macvlan.services; Service creation to first answer, failover
# p50/p99 over $VILLAGE_LANSVC_KILLS cable pulls (default 20), the same with
# the API server SIGSTOPped, the agents' CPU/RSS/API requests per minute
# with 5 and 100 LoadBalancer Services, what a LAN client sees of a kill
# with Local and with Cluster ($VILLAGE_LANSVC_STALE_KILLS, default 5: the
# endpoint staleness kube-proxy adds); then MetalLB L2 v0.16.2 (built by
# scripts/metallb.sh, cached in /var/cache/village) in the same cluster:
# its creation to first answer, failover and split brains over the same
# kills, then with the API server frozen ($VILLAGE_METALLB_FROZEN_KILLS,
# default the same; 0 skips). Each FIGURE with the load.
#
# The wireguard section (only with -only wireguard, ~3 minutes) is
# BenchmarkWireGuardVsVXLAN in pkg/overlay: two lab nodes, the wireguard
# backend (wireguard-go, the userspace device: a kernel without the
# WireGuard module) and vxlan alternated round by round
# ($VILLAGE_WGBENCH_ROUNDS, default 3): a node's join to its pod's first
# answer, iperf3 pod to pod ($VILLAGE_WGBENCH_IPERF seconds, default 4)
# with the CPU of each backend's processes, of iperf3 and of the machine,
# and TCP_RR; then both idle at 1,000 peers ($VILLAGE_WGBENCH_IDLE seconds,
# default 40), WireGuard's peers first silent, then answering. FIGURE lines
# with medians and ratios, each with the load averages.
#
# Extra arguments go to cnibench (see `go run ./bench/cmd/cnibench -h`).
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "bench.sh: run as root (it makes network namespaces)" >&2; exit 1; }
for tool in ip iptables iperf3 containerd runc; do
  command -v "$tool" >/dev/null || { echo "bench.sh: needs '$tool' (apt-get install -y iproute2 iptables iperf3 containerd runc)" >&2; exit 1; }
done
crictl=$(./scripts/crictl.sh)

./build_linux.sh >&2

kube_bench() {
  VILLAGE_KUBE_APISERVER="$(./scripts/kube-apiserver.sh)" VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref" \
    go test -run '^$' -bench '^BenchmarkAgentKube(Scale|Watches)$' -benchtime 1x -timeout 30m -v ./test/e2e | grep -E 'FIGURE|Benchmark|ok|FAIL|_test.go:'
}
kubelet_bench() {
  VILLAGE_KUBE_DIR="${VILLAGE_KUBE_DIR:-/var/cache/village/kubernetes-v1.37.2}" VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref" \
    go test -run '^$' -bench '^BenchmarkKubeletPodStart$' -benchtime 1x -timeout 90m -v ./test/kube | grep -E 'FIGURE|Benchmark|ok|FAIL|_test.go:'
}
flannel_bench() {
  VILLAGE_FLANNELD="$(./scripts/flannel.sh)" VILLAGE_KUBE_APISERVER="$(./scripts/kube-apiserver.sh)" VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref" \
    go test -run '^$' -bench '^BenchmarkControlPlaneVsFlannel$' -benchtime 1x -timeout 90m -v ./test/e2e | grep -E 'FIGURE|Benchmark|ok|FAIL|_test.go:'
}
netpol_bench() {
  export VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref"
  go test -c -o /tmp/village-netpol.test ./pkg/netpol
  (cd pkg/netpol && for b in 'BenchmarkCompile$ 20x 1' 'BenchmarkChange 20x 1' 'BenchmarkThroughput 1x 3'; do
    set -- $b
    /tmp/village-netpol.test -test.run '^$' -test.bench "$1" -test.benchtime "$2" -test.count "$3" | grep -E '^Benchmark' |
      while read -r l; do echo "$l   (load $(cut -d' ' -f1 /proc/loadavg))"; done
  done)
  go test -run '^$' -bench '^BenchmarkNetpolAdd$' -benchtime 30x -count 3 -timeout 20m ./test/e2e | grep -E '^Benchmark' |
    while read -r l; do echo "$l   (load $(cut -d' ' -f1 /proc/loadavg))"; done
  rm -f /tmp/village-netpol.test
  echo "load $(cut -d' ' -f1 /proc/loadavg)"
  VILLAGE_KUBE_APISERVER="$(./scripts/kube-apiserver.sh)" \
    go test -run '^$' -bench '^BenchmarkNetpolAgent$' -benchtime 1x -timeout 20m -v ./test/e2e | grep -E 'FIGURE|Benchmark|ok|FAIL|_test.go:'
  echo "load $(cut -d' ' -f1 /proc/loadavg)"
}
drops_bench() {
  export VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref"
  uptime
  go test -c -o /tmp/village-drops.test ./pkg/netpol/drops
  (cd pkg/netpol/drops && /tmp/village-drops.test -test.run '^$' -test.bench '^BenchmarkDrop(Latency|Flood|Logging)$' -test.benchtime 1x -test.v |
    grep -E 'FIGURE|^Benchmark|^ok|FAIL|_test.go:')
  rm -f /tmp/village-drops.test
  uptime
}
wireguard_bench() {
  uptime
  go test -c -o /tmp/village-wgbench.test ./pkg/overlay
  (cd pkg/overlay && /tmp/village-wgbench.test -test.run '^$' -test.bench '^BenchmarkWireGuardVsVXLAN$' -test.benchtime 1x -test.v |
    grep -E 'FIGURE|^Benchmark|^ok|^PASS|FAIL|_test.go:')
  rm -f /tmp/village-wgbench.test
  uptime
}
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "wireguard" ]; then
  wireguard_bench
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "drops" ]; then
  drops_bench
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "armvm" ]; then
  # BenchmarkArmVMFootprint in test/armvm: the arm64 VM of TestArmVM with
  # etcd and 5, then 50, peers; villaged and flanneld (arm64, built by
  # scripts/flannel.sh) each idle with a route to every peer; VmRSS/VmHWM.
  echo "load $(cut -d' ' -f1 /proc/loadavg)"
  go test -run '^$' -bench '^BenchmarkArmVMFootprint$' -benchtime 1x -timeout 30m -v ./test/armvm | grep -E 'METRIC|idle_rss|Benchmark|ok|FAIL|check'
  echo "load $(cut -d' ' -f1 /proc/loadavg)"
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "lansvc" ]; then
  go test -run '^$' -bench '^BenchmarkFailover$' -benchtime 1x -timeout 20m -v ./pkg/lansvc/speaker | grep -E 'FIGURE|Benchmark|ok|FAIL|_test.go:'
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "lansvc-kube" ]; then
  VILLAGE_METALLB_DIR="$(./scripts/metallb.sh)" \
  VILLAGE_KUBE_DIR="${VILLAGE_KUBE_DIR:-$(./scripts/kube.sh)}" VILLAGE_BIN_DIR="$PWD/bin" VILLAGE_REF_BIN_DIR="$PWD/bin/ref" \
    flock /tmp/village-kube.lock go test -run '^$' -bench '^BenchmarkLANServicesKube$' -benchtime 1x -timeout 120m -v ./test/kube | grep -E 'FIGURE|Benchmark|ok|FAIL|_test.go:'
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "netpol" ]; then
  netpol_bench
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "flannel" ]; then
  flannel_bench
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "kubelet" ]; then
  kubelet_bench
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "lan" ]; then
  go test -run '^$' -bench '^BenchmarkLANAddressSource$' -benchtime 30x -count 3 -timeout 30m ./test/e2e | grep -E 'Benchmark|ok|FAIL'
  exit
fi
if [ "${1:-}" = "-only" ] && [ "${2:-}" = "kube" ]; then
  kube_bench
  exit
fi
# Run from a private copy of the binaries, so a rebuild of ./bin by someone
# else during the run cannot change what is measured.
work=$(mktemp -d /tmp/village-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin/ref"
cp bin/village bin/village-ipam bin/loopback "$work/bin/"
cp bin/ref/bridge bin/ref/host-local bin/ref/loopback "$work/bin/ref/"
cp bin/cnitool "$work/cnitool"
export CGO_ENABLED=0
go build -trimpath -o "$work/cnibench" ./bench/cmd/cnibench
go test -c -o "$work/overlay.test" ./pkg/overlay
go build -trimpath -o "$work/tcprr" ./bench/cmd/tcprr
ls -l "$work"/bin/village "$work"/bin/village-ipam "$work"/bin/ref/bridge "$work"/bin/ref/host-local \
  | awk '{printf "binary %-12s %6.1f MB\n", $NF, $5/1048576}' | sed "s|$work/||" >&2

"$work/cnibench" -bin "$work/bin" -ref "$work/bin/ref" -cnitool "$work/cnitool" \
  -overlay-test "$work/overlay.test" -tcprr "$work/tcprr" -crictl "$crictl" -module-root "$PWD" "$@"
if [ "${1:-}" != "-only" ]; then
  kube_bench
fi
