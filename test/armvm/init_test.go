package armvm

// initScript is the VM's /init (busybox sh): each check prints "ARMVM PASS
// name" or "ARMVM FAIL name" with its output, the footprint "ARMVM METRIC
// name value", then "ARMVM DONE" and the VM powers off. Every namespace is
// made here; nothing leaves the VM (qemu has no NIC).
const initScript = prelude + checksScript

// prelude mounts, loads the modules and defines run, the first part of
// every VM's /init.
const prelude = `#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mkdir -p /bb
/bin/busybox --install -s /bb
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/bb
# Debian's busybox sh runs its own applets first: iproute2 by its path.
ip() { /bin/ip "$@"; }
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /run/netns /var/lib/cni /etc/cni/net.d /tmp/cache /etc/village
echo "ARMVM START $(uname -m) $(uname -r)"
for m in veth dummy vxlan bridge br_netfilter nf_tables nft_chain_nat nft_masq nf_nat ip_tables iptable_nat xt_MASQUERADE xt_comment xt_addrtype crc32c_generic; do
  modprobe $m 2>&1 | sed "s/^/ARMVM LOG modprobe: /"
done

run() {
  name=$1; shift
  if "$@" >/tmp/$name.log 2>&1; then echo "ARMVM PASS $name"; else
    echo "ARMVM FAIL $name"; sed "s/^/ARMVM LOG $name: /" /tmp/$name.log; fi
}
cni() { ip netns exec node env CNI_PATH=${WRAP:-}/usr/local/bin NETCONFPATH=/etc/cni/net.d CNI_CACHE_DIR=/tmp/cache cnitool "$@"; }
addr4() { ip -n $1 -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1; }
addr6() { ip -n $1 -o -6 addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1; }
# idle_metric NAME PID: after 10 s of idling, PID's VmRSS and VmHWM.
idle_metric() {
  sleep 10
  kill -0 $2 || return 1
  echo "ARMVM METRIC $1 $(grep VmRSS /proc/$2/status | awk '{print $2}') (peak $(grep VmHWM /proc/$2/status | awk '{print $2}'))" > /dev/console
}
`

// checksScript is the checks of TestArmVM.
const checksScript = `
cat > /etc/cni/net.d/10-village.conflist <<'CONF'
{"cniVersion":"1.0.0","name":"village","plugins":[
 {"type":"village","bridge":"village0","isGateway":true,"ipMasq":true,"hairpinMode":true,"clusterCIDR":"10.244.0.0/16",
  "ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]],
   "routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}},
 {"type":"portmap","capabilities":{"portMappings":true},"snat":true},
 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}
CONF
echo '{"cniVersion":"1.0.0","name":"loopback","type":"loopback"}' > /etc/cni/net.d/99-loopback.conf
cat > /etc/cni/net.d/20-village-ipt.conflist <<'CONF'
{"cniVersion":"1.0.0","name":"village-ipt","plugins":[
 {"type":"village","bridge":"village1","isGateway":true,"ipMasq":true,"ipMasqBackend":"iptables","clusterCIDR":"10.245.0.0/16",
  "ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.245.1.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}
CONF

# static peers: node1 (this node) and N others
peers() {
  n=$1; i=0; list='{"name":"node1","ip":"192.168.50.11","podCIDR":"10.244.1.0/24"}'
  while [ $i -lt $n ]; do
    list="$list,{\"name\":\"peer$i\",\"ip\":\"192.168.50.$((20+i))\",\"podCIDR\":\"10.244.$((10+i)).0/24\"}"
    i=$((i+1))
  done
  cat <<CONF
{"cniVersion":"1.0.0","name":"village","plugins":[
 {"type":"village","bridge":"village0","isDefaultGateway":true,"ipMasq":true,"clusterCIDR":"10.244.0.0/16",
  "ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.244.1.0/24"}]]},
  "backend":{"type":"vxlan","underlay":"eth0","vni":1,"port":4789,"nodes":[$list]}}]}
CONF
}

kernel() { uname -m; [ "$(uname -m)" = "$(cat /etc/village/expect)" ]; }
run kernel kernel

# The node, and a LAN peer that has no route to the pods: it answers a pod
# only when the node masquerades.
ip netns add node; ip -n node link set lo up
ip netns exec node sysctl -w net.ipv4.ip_forward=1 >/dev/null
ip netns add lan; ip -n lan link set lo up
ip link add up0 netns node type veth peer name eth0 netns lan
ip -n node addr add 192.168.77.1/24 dev up0; ip -n node link set up0 up
ip -n lan addr add 192.168.77.2/24 dev eth0; ip -n lan link set eth0 up

demo_add() {
  for p in p1 p2 p3; do
    ip netns add $p || return 1
    cni add loopback /run/netns/$p >/dev/null || return 1
    cni add village /run/netns/$p || return 1
  done
}
demo_ping() {
  for p in p2 p3; do
    ip netns exec p1 ping -c1 -W5 $(addr4 $p) || return 1
    ip netns exec p1 ping -6 -c1 -W5 $(addr6 $p) || return 1
  done
  for p in p1 p2 p3; do ip netns exec node ping -c1 -W5 $(addr4 $p) || return 1; done
}
masq_nft() {
  ip netns exec p1 ping -c1 -W5 192.168.77.2 || return 1
  ! ip netns exec node iptables -t nat -S | grep village
}
demo_check() { for p in p1 p2 p3; do cni check village /run/netns/$p || return 1; done; }
demo_del() {
  for p in p1 p2 p3; do
    cni del village /run/netns/$p || return 1
    cni del loopback /run/netns/$p || return 1
    ip netns del $p
  done
}
nothing_left() {
  ip -n node -o link
  ! ip -n node -o link | grep -q veth || return 1
  ls -A /var/lib/cni/networks/village 2>/dev/null
  ! ls -A /var/lib/cni/networks/village 2>/dev/null | grep -Eq '^[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+$|:'
}
masq_ipt() {
  ip netns add p4 && cni add village-ipt /run/netns/p4 || return 1
  ip netns exec node iptables -t nat -S | grep village || return 1
  ip netns exec p4 ping -c1 -W5 192.168.77.2 || return 1
  cni del village-ipt /run/netns/p4 && ip netns del p4
}
vxlan() {
  ip netns add va && ip netns add vb || return 1
  ip link add u0 netns va type veth peer name u0 netns vb || return 1
  ip -n va addr add 10.99.0.1/24 dev u0; ip -n va link set u0 up
  ip -n vb addr add 10.99.0.2/24 dev u0; ip -n vb link set u0 up
  ip -n va link add vx0 type vxlan id 42 local 10.99.0.1 remote 10.99.0.2 dstport 4789 dev u0 || return 1
  ip -n vb link add vx0 type vxlan id 42 local 10.99.0.2 remote 10.99.0.1 dstport 4789 dev u0 || return 1
  ip -n va addr add 10.98.0.1/24 dev vx0; ip -n va link set vx0 up
  ip -n vb addr add 10.98.0.2/24 dev vx0; ip -n vb link set vx0 up
  ip netns exec va ping -c2 -W5 10.98.0.2 || return 1
  ip -n va -d link show vx0
}
# pkg/wireguard's kernel path (userspace never): a WireGuard device in each
# of two namespaces joined by a veth, each the other's one peer; a ping
# between addresses routed through them, the device a kernel one, and the
# key kept when the device is ensured again.
wg_kernel() {
  modprobe wireguard || return 1
  ip netns add wa && ip netns add wb || return 1
  ip link add u1 netns wa type veth peer name u1 netns wb || return 1
  ip -n wa addr add 10.97.0.1/24 dev u1; ip -n wa link set u1 up
  ip -n wb addr add 10.97.0.2/24 dev u1; ip -n wb link set u1 up
  ka=$(ip netns exec wa wgcheck up villagewg.1 /tmp/wa/key 51820 1420) || return 1
  kb=$(ip netns exec wb wgcheck up villagewg.1 /tmp/wb/key 51820 1420) || return 1
  ip netns exec wa wgcheck peer villagewg.1 $kb 10.97.0.2:51820 10.96.2.0/24 || return 1
  ip netns exec wb wgcheck peer villagewg.1 $ka 10.97.0.1:51820 10.96.1.0/24 || return 1
  ip -n wa addr add 10.96.1.1/32 dev villagewg.1; ip -n wa route add 10.96.2.0/24 dev villagewg.1 || return 1
  ip -n wb addr add 10.96.2.1/32 dev villagewg.1; ip -n wb route add 10.96.1.0/24 dev villagewg.1 || return 1
  ip netns exec wa ping -c2 -W5 -I 10.96.1.1 10.96.2.1 || return 1
  ip -n wa -d link show villagewg.1 | grep -w wireguard || return 1
  [ "$(ip netns exec wa wgcheck up villagewg.1 /tmp/wa/key 51820 1420)" = "$ka" ] || return 1
  ip netns del wa; ip netns del wb
}
# A node with the static-peer conflist: one sync pass, then status is clean.
static_node() {
  ns=$1
  ip netns add $ns && ip -n $ns link set lo up || return 1
  ip -n $ns link add eth0 type dummy && ip -n $ns addr add 192.168.50.11/24 dev eth0 && ip -n $ns link set eth0 up
}
status() {
  static_node s3 || return 1
  peers 3 > /etc/village/s3.conflist
  ip netns exec s3 villaged sync --conf /etc/village/s3.conflist --node-name node1 --run-dir /run/village-s3 || return 1
  ip netns exec s3 villaged status --conf /etc/village/s3.conflist --node-name node1 --run-dir /run/village-s3
}
plugin_rss() {
  mkdir -p /tmp/wrap
  printf '#!/bin/sh\nexec /bin/busybox time -v -o /tmp/rss.$$ /usr/local/bin/village "$@"\n' > /tmp/wrap/village
  chmod +x /tmp/wrap/village
  ip netns add p5 && WRAP=/tmp/wrap: cni add village /run/netns/p5 || return 1
  kb=$(cat /tmp/rss.* | grep 'Maximum resident' | awk '{print $NF}')
  [ -n "$kb" ] || return 1
  echo "ARMVM METRIC plugin_add_peak_rss_kB $kb" > /dev/console
  WRAP=/tmp/wrap: cni del village /run/netns/p5
}
# villaged run with N static peers: its RSS once status is clean and it has
# idled a while.
agent_rss() {
  n=$1; ns=r$n
  static_node $ns || return 1
  peers $n > /etc/village/$ns.conflist
  # /bin/ip itself (not the function) so that $! becomes villaged
  /bin/ip netns exec $ns villaged run --conf /etc/village/$ns.conflist --node-name node1 --run-dir /run/village-$ns --metrics-addr off >/tmp/villaged-$n.log 2>&1 &
  pid=$!
  i=0
  until ip netns exec $ns villaged status --conf /etc/village/$ns.conflist --node-name node1 --run-dir /run/village-$ns >/dev/null 2>&1; do
    i=$((i+1)); [ $i -lt 120 ] || { cat /tmp/villaged-$n.log; kill $pid; return 1; }
    sleep 1
  done
  idle_metric villaged_idle_rss_kB_${n}peers $pid || return 1
  kill $pid
}

run demo-add demo_add
run demo-ping demo_ping
run masq-nftables masq_nft
run demo-check demo_check
run demo-del demo_del
run demo-nothing-left nothing_left
run masq-iptables masq_ipt
run vxlan vxlan
run wireguard-kernel wg_kernel
run villaged-status status
run plugin-rss plugin_rss
run villaged-rss-5 agent_rss 5
run villaged-rss-50 agent_rss 50
ls -l /usr/local/bin | awk '{print "ARMVM METRIC size " $5 " " $9}'
echo "ARMVM METRIC mem_total $(grep MemTotal /proc/meminfo)"
echo "ARMVM DONE"
poweroff -f
`
