package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
)

// TestStickyLANAddressAcrossNodes: with "sticky" in the LAN pool (shared
// through a real etcd on the LAN host), a Kubernetes pod shop/db-0 deleted
// on node 1 gets its LAN address back on node 2; meanwhile other pods (and
// node 1's GC) do not take it; the LAN host, whose neighbour entry still
// names another MAC, reaches the pod on node 2 as soon as it is up (its
// announcement); once the hold has ended GC reclaims it and the address is
// free for anyone.
func TestStickyLANAddressAcrossNodes(t *testing.T) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", "192.168.77.5/24")
	etcd := etcdtest.StartIn(t, host, "192.168.77.5")
	cli := etcd.ClientIn(t, host)
	const prefix = "/sticky-e2e"
	store := func(node int, grace string) string {
		return fmt.Sprintf(`,"store":{"type":"etcd","endpoints":[%q],"prefix":%q,"nodeName":"node-%d"},"sticky":%q`, etcd.Endpoints[0], prefix, node, grace)
	}
	// Three LAN addresses, .200-.202. DEL with the long list holds for
	// 10 minutes; with the short one for a second (the grace is read at DEL).
	var nodes []*Node
	var long, short []*libcni.NetworkConfigList
	for i := 1; i <= 2; i++ {
		n := NewNode(t)
		lan.Attach(t, n.NS, "lan0", fmt.Sprintf("192.168.77.1%d/24", i))
		nodes = append(nodes, n)
		pods := fmt.Sprintf("10.53.%d.0/24", i)
		long = append(long, ConfList(t, lanList(n, "sticky", pods, "192.168.77.200", "192.168.77.202", store(i, "10m"))))
		short = append(short, ConfList(t, lanList(n, "sticky", pods, "192.168.77.200", "192.168.77.202", store(i, "1s"))))
	}
	n1, n2 := nodes[0], nodes[1]
	k8s := func(name string) [][2]string {
		return [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "shop"}, {"K8S_POD_NAME", name}}
	}
	holdKey := func(ip string) string {
		resp, err := cli.Get(context.Background(), prefix+"/ipam/sticky/ips/"+ip)
		if err != nil {
			t.Fatalf("reading etcd: %v", err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	db := n1.NewPod()
	r, err := addArgs(n1, long[0], db, k8s("db-0")...)
	must(t, err, "ADD of shop/db-0 on node 1")
	ip, mac := lanIP(t, r), lanMAC(t, r)
	must(t, testenv.Ping(host, ip, 2), "LAN host -> db-0 %s on node 1", ip)
	must(t, delArgs(n1, long[0], db, k8s("db-0")...), "DEL of db-0 on node 1")
	if v := holdKey(ip); !strings.Contains(v, `"containerID":"village-hold_shop_db-0"`) {
		t.Fatalf("etcd record of %s after DEL of db-0: %q, want a hold for shop/db-0", ip, v)
	}
	// Node 1's GC (no live pods there) keeps the hold.
	must(t, n1.GC(long[0]), "GC on node 1")

	// Meanwhile other pods, one per node, get the two other addresses.
	var others []*Pod
	for i, n := range nodes {
		p := n.NewPod()
		r, err := addArgs(n, long[i], p, k8s(fmt.Sprintf("web-%d", i))...)
		must(t, err, "ADD of another pod on node %d", i+1)
		if got := lanIP(t, r); got == ip {
			t.Fatalf("another pod on node %d got %s, held for db-0", i+1, got)
		}
		others = append(others, p)
	}

	// The LAN host still has db-0's address at another MAC; db-0 comes back
	// on node 2 with its address and MAC, and announces them.
	testenv.MustIP(t, host, "neigh", "replace", ip, "lladdr", "02:00:00:00:00:01", "dev", "eth0", "nud", "stale")
	db2 := n2.NewPod()
	r, err = addArgs(n2, long[1], db2, k8s("db-0")...)
	must(t, err, "ADD of shop/db-0 on node 2")
	if got := lanIP(t, r); got != ip {
		t.Fatalf("db-0 on node 2 got %s, want its address %s back", got, ip)
	}
	if got := lanMAC(t, r); got != mac {
		t.Fatalf("db-0 on node 2 has MAC %s, want %s as on node 1", got, mac)
	}
	waitFor(t, 10*time.Second, "the LAN host's neighbour entry of "+ip+" updated by db-0's announcement on node 2", func() (bool, string) {
		out := testenv.MustIP(t, host, "neigh", "show", ip, "dev", "eth0")
		return strings.Contains(out, mac), fmt.Sprintf("neighbour entry %q, want lladdr %s", out, mac)
	})
	must(t, testenv.Ping(host, ip, 2), "LAN host -> db-0 %s on node 2", ip)
	if v := holdKey(ip); !strings.Contains(v, `"containerID":"`+db2.ID+`"`) || !strings.Contains(v, `"node":"node-2"`) {
		t.Fatalf("etcd record of %s: %q, want db-0's container on node 2", ip, v)
	}

	// Deleted with a one-second grace: node 2's GC reclaims the hold once it
	// has ended, and the address is free for any pod.
	must(t, delArgs(n2, short[1], db2, k8s("db-0")...), "DEL of db-0 on node 2")
	if v := holdKey(ip); !strings.Contains(v, "village-hold_shop_db-0") {
		t.Fatalf("etcd record of %s after DEL: %q, want a hold", ip, v)
	}
	waitFor(t, 30*time.Second, "node 2's GC reclaiming the ended hold of "+ip, func() (bool, string) {
		if err := n2.GC(short[1], others[1]); err != nil {
			return false, err.Error()
		}
		v := holdKey(ip)
		return v == "", "record " + v
	})
	p := n1.NewPod()
	r, err = addArgs(n1, long[0], p, k8s("web-9")...)
	must(t, err, "ADD of a third pod")
	if got := lanIP(t, r); got != ip {
		t.Fatalf("the only free address is %s, got %s", ip, got)
	}
	must(t, n1.Del(long[0], others[0]), "DEL")
	must(t, n2.Del(long[1], others[1]), "DEL")
	must(t, n1.Del(long[0], p), "DEL")
}

// delArgs is DEL with CNI_ARGS, as a Kubernetes runtime sends them.
func delArgs(n *Node, l *libcni.NetworkConfigList, p *Pod, args ...[2]string) error {
	return n.in(func() error {
		rt := p.rt()
		rt.Args = args
		return n.CNI.DelNetworkList(context.Background(), l, rt)
	})
}

// lanMAC returns the MAC of the result's LAN interface.
func lanMAC(t *testing.T, r *current.Result) string {
	t.Helper()
	for _, ifc := range r.Interfaces {
		if ifc.Name == "net1" && ifc.Mac != "" {
			return ifc.Mac
		}
	}
	t.Fatalf("result has no net1 MAC: %+v", r)
	return ""
}
