#!/usr/bin/env bash
# Village demo: a home lab in a sandbox. It builds the binaries, then makes
# network namespaces for a LAN (a bridge), a "laptop" on it, and two
# "nodes" plugged into it, each with its own pod subnet and a VXLAN overlay
# between them (a static peer list: no agent needed). Pods are wired with
# ./bin/cnitool exactly as a runtime would: two on node1, one of them with
# its own address on the LAN, and one on node2. It shows
#   - pods on both nodes reaching each other over VXLAN,
#   - the laptop reaching the LAN pod at its own LAN address, directly,
#   - an mDNS question from the laptop answered by that pod (the way Home
#     Assistant, printers and media servers are found on a home LAN),
#   - CHECK, and DEL leaving nothing behind.
# It touches nothing outside the namespaces and the temporary directory it
# makes, and removes them at the end, failed or not. Run as root. With
# VILLAGE_BIN_DIR set (as the tests set it) it uses the binaries there and
# neither installs nor builds them.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (it makes network namespaces)" >&2; exit 1; }
export PATH="$PATH:/usr/local/go/bin"
BIN=${VILLAGE_BIN_DIR:-}
if [ -z "$BIN" ]; then
  DEPS_PROFILE=demo ./scripts/deps.sh
  ./build_linux.sh
  BIN=$PWD/bin
fi
TMP=$(mktemp -d)
go build -o "$TMP/mdnsdemo" ./internal/mdnsdemo

TAG="vdemo$$"
LAN="$TAG-lan"
LAPTOP="$TAG-laptop"
NODES=("$TAG-node1" "$TAG-node2")
NET=village
LANPOD="$TAG-lanpod"   # node1, with a LAN address
PODB="$TAG-pod-b"      # node1
PODC="$TAG-pod-c"      # node2
declare -A NODE_OF=([$LANPOD]=${NODES[0]} [$PODB]=${NODES[0]} [$PODC]=${NODES[1]})
PODS=("$LANPOD" "$PODB" "$PODC")
MDNS_PID=

cleanup() {
  set +e
  [ -n "$MDNS_PID" ] && kill "$MDNS_PID" 2>/dev/null && wait "$MDNS_PID" 2>/dev/null
  for n in "${PODS[@]}" "${NODES[@]}" "$LAPTOP" "$LAN"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# reach NS ADDR: NS pings ADDR, asking again for up to 30 s (a first
# packet may wait for ARP on a busy machine).
reach() {
  local i
  for i in $(seq 30); do inns "$1" ping -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
  echo "demo.sh: $1 does not reach $2" >&2; return 1
}
step() { printf '\n=== %s\n' "$*"; }
inns() { local n=$1; shift; ip netns exec "$n" "$@"; }
# cnitool VERB POD [CNI_ARGS]: as the pod's node's runtime, with that
# node's conflist and a cache of its own.
cnitool() {
  local verb=$1 pod=$2 args=${3:-} node=${NODE_OF[$2]}
  inns "$node" env CNI_PATH="$BIN:$BIN/ref" NETCONFPATH="$TMP/$node/conf" \
    CNI_CACHE_DIR="$TMP/$node/cache" CNI_ARGS="$args" "$BIN/cnitool" "$verb" "$NET" "/run/netns/$pod"
}
# conflist I: node I's network, the same on every node but its own pod
# subnet (and, on node1, the LAN section: pods that ask get a macvlan on
# the node's eth0 with an address from 192.168.50.200-209).
conflist() {
  local i=$1 lan=
  if [ "$i" = 1 ]; then
    lan=',"macvlan": {"master": "eth0", "pods": "annotated", "hostShim": true,
      "ipam": {"type": "village-ipam", "dataDir": "'"$TMP/node$i/lan"'",
        "ranges": [[{"subnet": "192.168.50.0/24", "rangeStart": "192.168.50.200", "rangeEnd": "192.168.50.209", "gateway": "192.168.50.1"}]]}}'
  fi
  cat <<EOF
{"cniVersion": "1.1.0", "name": "$NET", "plugins": [
  {"type": "village", "bridge": "village0", "isDefaultGateway": true, "ipMasq": true,
   "clusterCIDR": "10.244.0.0/16",
   "ipam": {"type": "village-ipam", "dataDir": "$TMP/node$i/pods", "ranges": [[{"subnet": "10.244.$i.0/24"}]]},
   "backend": {"type": "vxlan", "underlay": "eth0", "vni": 1, "nodes": [
     {"name": "node1", "ip": "192.168.50.11", "podCIDR": "10.244.1.0/24"},
     {"name": "node2", "ip": "192.168.50.12", "podCIDR": "10.244.2.0/24"}]}$lan}]}
EOF
}

step "a LAN ($LAN, bridge lan0), a laptop on it at 192.168.50.100, two nodes at .11 and .12"
ip netns add "$LAN"
inns "$LAN" ip link add lan0 type bridge
inns "$LAN" ip link set lan0 up
plug() { # plug NS ADDR: NS's eth0 on the LAN bridge
  local n=$1 addr=$2 port="p${3}"
  ip netns add "$n"
  inns "$n" ip link set lo up
  inns "$LAN" ip link add "$port" type veth peer name eth0 netns "$n"
  inns "$LAN" ip link set "$port" master lan0 up
  inns "$n" ip addr add "$addr/24" dev eth0
  inns "$n" ip link set eth0 up
}
plug "$LAPTOP" 192.168.50.100 0
for i in 1 2; do
  plug "${NODES[$((i-1))]}" "192.168.50.1$i" "$i"
  mkdir -p "$TMP/${NODES[$((i-1))]}/conf"
  conflist "$i" >"$TMP/${NODES[$((i-1))]}/conf/10-village.conflist"
done
echo "node1's network, as a runtime reads it from its conflist directory:"
sed 's/^/  /' "$TMP/${NODES[0]}/conf/10-village.conflist"

step "ADD: $LANPOD and $PODB on node1 ($LANPOD asks for the LAN: CNI_ARGS VILLAGE_LAN=true), $PODC on node2"
for p in "${PODS[@]}"; do ip netns add "$p"; done
cnitool add "$LANPOD" "VILLAGE_LAN=true" >"$TMP/$LANPOD.json"
cnitool add "$PODB" >/dev/null
cnitool add "$PODC" >/dev/null
declare -A V4
for p in "${PODS[@]}"; do
  V4[$p]=$(ip -n "$p" -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
  printf '  %-18s on %-14s eth0 %s\n' "$p" "${NODE_OF[$p]}" "${V4[$p]}"
done
LANIP=$(ip -n "$LANPOD" -o -4 addr show dev net1 | awk '{print $4}' | cut -d/ -f1)
printf '  %-18s on %-14s net1 %s (its own address on the LAN, its own MAC %s)\n' "$LANPOD" "${NODES[0]}" \
  "$LANIP" "$(ip -n "$LANPOD" -o link show dev net1 | grep -o 'link/ether [^ ]*' | cut -d' ' -f2)"

step "VXLAN: pods on node1 and node2 reach each other across the LAN"
inns "${NODES[0]}" ip route show 10.244.2.0/24 | sed 's/^/  node1: /'
for pair in "$PODB:$PODC" "$PODC:$PODB" "$LANPOD:$PODC"; do
  from=${pair%%:*} to=${pair#*:}
  reach "$from" "${V4[$to]}"
  echo "  $from -> $to (${V4[$to]}) ok"
done

step "LAN: the laptop reaches $LANPOD at $LANIP directly, no NodePort, no node address"
reach "$LAPTOP" "$LANIP"
echo "  laptop -> $LANIP ok"
echo "  the laptop's neighbour table (the pod's own MAC answers, not the node's):"
inns "$LAPTOP" ip neigh show "$LANIP" | sed 's/^/    /'
reach "${NODES[0]}" "$LANIP"
echo "  node1 -> $LANIP ok (through the host shim: a macvlan cannot reach its own master otherwise)"

step "mDNS: the laptop asks for village-demo.local and the LAN pod answers"
# Started directly, not through a shell function, so that $! is the
# server itself (ip netns exec execs it) and the kill below reaches it.
ip netns exec "$LANPOD" "$TMP/mdnsdemo" serve -iface net1 -name village-demo.local -addr "$LANIP" -for 2m >"$TMP/mdns.log" 2>&1 &
MDNS_PID=$!
inns "$LAPTOP" "$TMP/mdnsdemo" query -iface eth0 -name village-demo.local -timeout 30s | sed 's/^/  laptop: /'
kill "$MDNS_PID"; wait "$MDNS_PID" 2>/dev/null || true; MDNS_PID=
sed 's/^/  the LAN pod: /' "$TMP/mdns.log"

step "CHECK: every pod, as the runtime would"
for p in "${PODS[@]}"; do cnitool check "$p" && echo "  $p ok"; done

step "DEL: every pod, then what is left on the nodes"
cnitool del "$LANPOD" "VILLAGE_LAN=true"
cnitool del "$PODB"
cnitool del "$PODC"
left=0
for i in 1 2; do
  n=${NODES[$((i-1))]}
  # The disk store keeps host-local's layout: one file per address held,
  # beside its lock, its last_reserved_ip files and its own index.
  allocs=$(find "$TMP/node$i" -type f ! -name lock ! -name 'last_reserved_ip*' ! -path '*/.village/*' | wc -l)
  veths=$(inns "$n" ip -o link show type veth master village0 | wc -l)
  macvlans=$(inns "$n" ip -o link show type macvlan | grep -vc vshim- || true)
  echo "  node$i: address allocations left $allocs, pod veths left $veths, pod macvlans left $macvlans"
  left=$((left + allocs + veths + macvlans))
done
[ "$left" = 0 ] || { echo "demo.sh: DEL left objects behind" >&2; exit 1; }

step "demo finished: all steps passed"
