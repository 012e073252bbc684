package armvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/debs"
	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/internal/testenv"
)

// BenchmarkArmVMFootprint is the side-by-side idle memory of villaged and
// flanneld on arm64, in the VM TestArmVM boots (`./scripts/bench.sh -only
// armvm`). Both agents do the same job from the same place: one etcd
// (Debian's etcd-server:arm64, in a LAN namespace of the VM) holds 5, then 50,
// peers in each one's format (Village's registry records and subnet leases,
// flannel's subnet leases under etcd leases, as their agents write them); each
// agent runs alone in a fresh node namespace on that LAN with the vxlan
// backend, until it has a route to every peer, then idles 10 s; its VmRSS and
// VmHWM are read from /proc. flanneld v0.28.10 is built for arm64 from the
// module proxy by scripts/flannel.sh (FLANNEL_GOARCH=arm64). It reports
// through the console's ARMVM METRIC lines (logged); it is a benchmark, not
// part of the test command, because it builds flanneld and boots a VM for a
// figure, not a verdict. Emulated time says nothing about speed: memory only.
func BenchmarkArmVMFootprint(b *testing.B) {
	tg := targets[0] // arm64: the side-by-side platform
	root, err := testenv.ModuleRoot()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "scripts/flannel.sh"))
	cmd.Env = append(os.Environ(), "FLANNEL_GOARCH="+tg.goarch)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("scripts/flannel.sh for %s: %v", tg.goarch, err)
	}
	flanneld := strings.TrimSpace(string(out))
	etcdRoot, err := debs.Root(tg.debArch, "etcd-server", "etcd-client")
	if err != nil {
		b.Fatal(err)
	}
	runFootprint(b, tg, flanneld, etcdRoot)
}

func runFootprint(b *testing.B, tg target, flanneld, etcdRoot string) {
	console := bootVM(b, tg, vmSpec{script: prelude + footprintScript, extra: func(t testing.TB, add func(ociimage.File)) {
		for _, p := range [][2]string{
			{flanneld, "/usr/local/bin/flanneld"},
			{filepath.Join(etcdRoot, "usr/bin/etcd"), "/usr/local/bin/etcd"},
			{filepath.Join(etcdRoot, "usr/bin/etcdctl"), "/usr/local/bin/etcdctl"},
		} {
			f, err := ociimage.HostFile(p[0], p[1])
			if err != nil {
				t.Fatal(err)
			}
			add(f)
		}
	}})
	report(b, tg, console, footprintChecks)
}

// footprintChecks are the checks footprintScript reports.
var footprintChecks = []string{"etcd", "villaged-etcd-5", "flanneld-5", "villaged-etcd-50", "flanneld-50"}

// footprintScript runs after prelude in BenchmarkArmVMFootprint's VM.
const footprintScript = `
# The LAN: a bridge in namespace lan, etcd on it at 192.168.50.5.
ip netns add lan; ip -n lan link set lo up
ip -n lan link add br0 type bridge; ip -n lan addr add 192.168.50.5/24 dev br0; ip -n lan link set br0 up
E="etcdctl --endpoints http://192.168.50.5:2379"
etcd_up() {
  ip netns exec lan env ETCD_UNSUPPORTED_ARCH=$(uname -m | sed 's/aarch64/arm64/') etcd --data-dir /tmp/etcd \
    --listen-client-urls http://192.168.50.5:2379 --advertise-client-urls http://192.168.50.5:2379 \
    --listen-peer-urls http://127.0.0.1:2380 >/tmp/etcd.log 2>&1 &
  i=0
  until ip netns exec lan $E endpoint health; do
    i=$((i+1)); [ $i -lt 120 ] || { cat /tmp/etcd.log; return 1; }
    sleep 1
  done
  ip netns exec lan $E put /coreos.com/network/config '{"Network":"10.244.0.0/16","SubnetLen":24,"Backend":{"Type":"vxlan","VNI":1}}'
}
run etcd etcd_up
LEASE=$(ip netns exec lan $E lease grant 86400 | awk '{print $2}')

# peers_to N: peers 0..N-1 in both formats (the ones already there stay).
have=0
peers_to() {
  while [ $have -lt $1 ]; do
    i=$have; ip4=192.168.50.$((20+i)); sn=10.244.$((10+i)).0; mac=02:00:00:00:00:$(printf %02x $i)
    ip netns exec lan $E put /village/nodes/village/peer$i "{\"name\":\"peer$i\",\"ip\":\"$ip4\",\"podCIDRs\":[\"$sn/24\"],\"vtepMAC\":\"$mac\"}" --lease=$LEASE >/dev/null
    ip netns exec lan $E put /village/subnets/village/$sn/24 "peer$i" >/dev/null
    ip netns exec lan $E put /coreos.com/network/subnets/$sn-24 "{\"PublicIP\":\"$ip4\",\"BackendType\":\"vxlan\",\"BackendData\":{\"VNI\":1,\"VtepMAC\":\"$mac\"}}" --lease=$LEASE >/dev/null
    have=$((have+1))
  done
}

cat > /etc/village/etcd.conflist <<'CONF'
{"cniVersion":"1.0.0","name":"village","plugins":[
 {"type":"village","bridge":"village0","isDefaultGateway":true,"ipMasq":true,"clusterCIDR":"10.244.0.0/16",
  "ipam":{"type":"village-ipam"},
  "backend":{"type":"vxlan","underlay":"eth0","vni":1,"port":4789,
   "registry":{"type":"etcd","endpoints":["http://192.168.50.5:2379"],"prefix":"/village","ttl":60,"subnetLen":24}}}]}
CONF

# node NS: a fresh node namespace on the LAN at 192.168.50.11.
node() {
  local ns=$1
  ip netns add $ns && ip -n $ns link set lo up || return 1
  ip link add eth0 netns $ns type veth peer name $ns netns lan || return 1
  ip -n lan link set $ns master br0; ip -n lan link set $ns up
  ip -n $ns addr add 192.168.50.11/24 dev eth0 && ip -n $ns link set eth0 up
}
# idle_rss NAME NS PID N: waits until NS has a route to each of the N peers'
# subnets, idles 10 s, prints the agent's VmRSS and VmHWM.
idle_rss() {
  local what=$1 ns=$2 pid=$3 n=$4 i=0
  until [ "$(ip -n $ns -4 route | grep -cE '^10[.]244[.]([1-9][0-9])[.]0/24')" -ge $n ]; do
    i=$((i+1)); [ $i -lt 180 ] || { ip -n $ns -4 route; return 1; }
    kill -0 $pid || return 1
    sleep 1
  done
  idle_metric ${what}_idle_rss_kB_${n}peers $pid
}
stop() { local i=0; kill $1; while kill -0 $1 2>/dev/null; do i=$((i+1)); [ $i -lt 30 ] || kill -9 $1; sleep 1; done; ip netns del $2; }
villaged_etcd() {
  local n=$1 ns=v$1
  node $ns || return 1
  /bin/ip netns exec $ns villaged run --conf /etc/village/etcd.conflist --node-name node1 --run-dir /run/village-$ns --metrics-addr off >/tmp/villaged-$ns.log 2>&1 &
  pid=$!
  idle_rss villaged $ns $pid $n || { cat /tmp/villaged-$ns.log; stop $pid $ns; return 1; }
  stop $pid $ns
  ip netns exec lan $E del /village/nodes/village/node1 >/dev/null
}
flanneld_etcd() {
  local n=$1 ns=f$1
  node $ns || return 1
  mkdir -p /run/flannel-$ns
  /bin/ip netns exec $ns flanneld --etcd-endpoints=http://192.168.50.5:2379 --iface=eth0 --ip-masq=false \
    --subnet-file=/run/flannel-$ns/subnet.env >/tmp/flanneld-$ns.log 2>&1 &
  pid=$!
  idle_rss flanneld $ns $pid $n || { cat /tmp/flanneld-$ns.log; stop $pid $ns; return 1; }
  stop $pid $ns
}
peers_to 5
run villaged-etcd-5 villaged_etcd 5
run flanneld-5 flanneld_etcd 5
peers_to 50
run villaged-etcd-50 villaged_etcd 50
run flanneld-50 flanneld_etcd 50
echo "ARMVM METRIC mem_total $(grep MemTotal /proc/meminfo)"
echo "ARMVM DONE"
poweroff -f
`
