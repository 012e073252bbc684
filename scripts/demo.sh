#!/usr/bin/env bash
# Village demo: builds the binaries, makes a sandbox "node" network namespace
# with three "pod" namespaces, wires them with ./bin/cnitool and conf/, shows
# addresses, pings pod<->pod (IPv4 and IPv6) and node->pod, runs CHECK and DEL,
# and cleans up. It touches nothing outside the namespaces it makes (plus the
# IPAM state directory of the demo network, removed at the end). Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (it makes network namespaces)" >&2; exit 1; }
export PATH="$PATH:/usr/local/go/bin"
DEPS_PROFILE=demo ./scripts/deps.sh

./build_linux.sh

TAG="vdemo$$"
NODE="$TAG-node"
PODS=("$TAG-pod1" "$TAG-pod2" "$TAG-pod3")
NET=village
DATA=/var/lib/cni/networks/$NET
CACHE=$(mktemp -d)
had_data=0; [ -e "$DATA" ] && had_data=1

cleanup() {
  set +e
  for p in "${PODS[@]}"; do ip netns del "$p" 2>/dev/null; done
  ip netns del "$NODE" 2>/dev/null
  [ "$had_data" = 0 ] && rm -rf "$DATA"
  rm -rf "$CACHE"
}
trap cleanup EXIT

step() { printf '\n=== %s\n' "$*"; }
innode() { ip netns exec "$NODE" "$@"; }
cnitool() {
  innode env CNI_PATH="$PWD/bin:$PWD/bin/ref" NETCONFPATH="$PWD/conf" CNI_CACHE_DIR="$CACHE" ./bin/cnitool "$@"
}

step "sandbox node $NODE and pods ${PODS[*]}"
ip netns add "$NODE"
innode ip link set lo up
for p in "${PODS[@]}"; do ip netns add "$p"; done

step "ADD: each pod gets loopback and eth0 through ./bin/cnitool with conf/"
for p in "${PODS[@]}"; do
  cnitool add loopback "/run/netns/$p" >/dev/null
  cnitool add "$NET" "/run/netns/$p" >"$CACHE/$p.json"
done

declare -A V4 V6
for p in "${PODS[@]}"; do
  V4[$p]=$(ip -n "$p" -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
  V6[$p]=$(ip -n "$p" -o -6 addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1)
  printf '%-16s eth0 %-14s %s\n' "$p" "${V4[$p]}" "${V6[$p]}"
done
echo "node bridge:"; innode ip -br addr show village0

step "ping pod1 -> pod2, pod3 (IPv4 and IPv6) and node -> every pod"
for p in "${PODS[@]:1}"; do
  ip netns exec "${PODS[0]}" ping -c1 -W2 "${V4[$p]}" >/dev/null && echo "${PODS[0]} -> ${V4[$p]} ok"
  ip netns exec "${PODS[0]}" ping -6 -c1 -W2 "${V6[$p]}" >/dev/null && echo "${PODS[0]} -> ${V6[$p]} ok"
done
for p in "${PODS[@]}"; do
  innode ping -c1 -W2 "${V4[$p]}" >/dev/null && echo "node -> ${V4[$p]} ok"
done

step "masquerade: one shared rule set for the network (nftables, or iptables on an iptables-legacy host)"
if innode nft list table inet "village-$NET" 2>/dev/null; then :; else
  innode iptables -t nat -S | grep 'village:' || { echo "demo.sh: no masquerade rules for $NET" >&2; exit 1; }
fi

step "CHECK"
for p in "${PODS[@]}"; do cnitool check "$NET" "/run/netns/$p" && echo "$p ok"; done

step "DEL"
for p in "${PODS[@]}"; do
  cnitool del "$NET" "/run/netns/$p"
  cnitool del loopback "/run/netns/$p"
  echo "$p deleted"
done
left=$(find "$DATA" -maxdepth 1 -type f ! -name lock ! -name 'last_reserved_ip*' | wc -l)
veths=$(innode ip -o link show type veth | wc -l)
echo "allocations left: $left, veths left: $veths"
[ "$left" = 0 ] && [ "$veths" = 0 ]

step "demo finished: all steps passed"
