package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
)

// TestSharedLANPoolThroughEtcd is the LAN layout of the seed design: two
// nodes and a LAN host on one namespace LAN, etcd on the LAN host, pods on
// both nodes taking LAN addresses from one shared range.
func TestSharedLANPoolThroughEtcd(t *testing.T) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", "192.168.77.5/24")
	etcd := etcdtest.StartIn(t, host, "192.168.77.5")
	store := fmt.Sprintf(`,"store":{"type":"etcd","endpoints":[%q],"prefix":"/lan-e2e"}`, etcd.Endpoints[0])

	nodes, lists := sharedLANNodes(t, lan, "10.52", func(int) string { return store })

	// 12 pods, 6 per node, all added at once: distinct LAN addresses.
	all := addLANPodsAtOnce(t, nodes, lists, 12)
	// The LAN host reaches every pod; each node reaches its own pods through
	// its shim; a pod on node 1 reaches a pod on node 2 over the LAN.
	for _, p := range all {
		must(t, testenv.Ping(host, p.ip, 2), "LAN host -> %s", p.ip)
		must(t, testenv.Ping(nodes[p.node].NS, p.ip, 2), "node %d -> its pod %s", p.node+1, p.ip)
	}
	pingAcrossNodes(t, all)

	// The range is full: the next ADD fails naming it and leaves nothing.
	extra := nodes[0].NewPod()
	_, err := nodes[0].Add(lists[0], extra)
	if err == nil || !strings.Contains(err.Error(), "192.168.77.200") {
		t.Fatalf("ADD past the shared range: %v", err)
	}
	if out := testenv.MustIP(t, extra.NS, "-o", "link"); strings.Contains(out, "eth0") || strings.Contains(out, "net1") {
		t.Fatalf("failed ADD left interfaces: %s", out)
	}
	if got := len(ipFiles(t, filepath.Join(nodes[0].Dir, "pods"))); got != 6 {
		t.Fatalf("%d pod-range allocations on node 1, want 6 (the failed ADD's eth0 address must be released)", got)
	}

	// etcd down: ADD fails fast, names the endpoint, leaves nothing;
	// STATUS says 50; DEL reports the error and succeeds once etcd is back.
	etcd.Stop()
	_, err = nodes[1].Add(lists[1], extra)
	t.Logf("ADD with etcd down: %v", err)
	if err == nil || !strings.Contains(err.Error(), "192.168.77.5:2379") || !strings.Contains(err.Error(), "unreachable after") {
		t.Fatalf("ADD with etcd down: %v, want its etcd timeout to fire (unreachable after ...) naming the endpoint", err)
	}
	if out := testenv.MustIP(t, extra.NS, "-o", "link"); strings.Contains(out, "eth0") || strings.Contains(out, "net1") {
		t.Fatalf("ADD with etcd down left interfaces: %s", out)
	}
	var e *types.Error
	if err := nodes[1].Status(lists[1]); err == nil || !asCNI(err, &e) || e.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS with etcd down: %v, want code 50", err)
	}
	victim := all[0]
	if err := nodes[victim.node].Del(lists[victim.node], victim.pod); err == nil {
		t.Fatal("DEL with etcd down succeeded: the LAN allocation cannot have been released")
	}
	etcd.Restart()
	must(t, nodes[victim.node].Del(lists[victim.node], victim.pod), "DEL once etcd is back")
	must(t, nodes[1].Status(lists[1]), "STATUS once etcd is back")
	r := nodes[1].MustAdd(lists[1], extra)
	if ip := lanIP(t, r); ip != victim.ip {
		t.Fatalf("the only free LAN address is %s, got %s", victim.ip, ip)
	}

	// After DEL of everything the whole range is free again: 12 more pods fit.
	for _, p := range all[1:] {
		must(t, nodes[p.node].Del(lists[p.node], p.pod), "DEL")
	}
	must(t, nodes[1].Del(lists[1], extra), "DEL")
	for i := range 12 {
		nodes[i%2].MustAdd(lists[i%2], nodes[i%2].NewPod())
	}
}

// pingAcrossNodes proves that a pod on node 1 reaches a pod on node 2 over
// the LAN (the last of each node's pods in all).
func pingAcrossNodes(t *testing.T, all []lanPod) {
	t.Helper()
	var a, b lanPod
	for _, p := range all {
		if p.node == 0 {
			a = p
		} else {
			b = p
		}
	}
	must(t, testenv.Ping(a.pod.NS, b.ip, 2), "pod on node 1 -> pod on node 2 over the LAN")
}

// sharedLANNodes makes two nodes on lan (192.168.77.11 and .12) with the
// "shared" network: pod subnet <podNet>.<i>.0/24 and LAN addresses from
// 192.168.77.200-211, 12 addresses both nodes share through the store
// section storeOf(i) returns for node i (1 and 2).
func sharedLANNodes(t *testing.T, lan *LAN, podNet string, storeOf func(i int) string) ([]*Node, []*libcni.NetworkConfigList) {
	t.Helper()
	var nodes []*Node
	var lists []*libcni.NetworkConfigList
	for i := 1; i <= 2; i++ {
		n := NewNode(t)
		lan.Attach(t, n.NS, "lan0", fmt.Sprintf("192.168.77.1%d/24", i))
		nodes = append(nodes, n)
		lists = append(lists, ConfList(t, lanList(n, "shared", fmt.Sprintf("%s.%d.0/24", podNet, i), "192.168.77.200", "192.168.77.211", storeOf(i))))
	}
	return nodes, lists
}

// lanPod is a pod placed on one of several nodes with its LAN address.
type lanPod struct {
	node int
	pod  *Pod
	ip   string
}

// addLANPodsAtOnce adds n pods, alternating between the nodes, all at once,
// and fails when any ADD fails or two pods got the same LAN address.
func addLANPodsAtOnce(t *testing.T, nodes []*Node, lists []*libcni.NetworkConfigList, n int) []lanPod {
	t.Helper()
	var mu sync.Mutex
	var all []lanPod
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		node := i % len(nodes)
		p := nodes[node].NewPod()
		wg.Go(func() {
			res, err := nodes[node].Add(lists[node], p)
			if err != nil {
				errs <- err
				return
			}
			cur, _ := current.NewResultFromResult(res)
			mu.Lock()
			all = append(all, lanPod{node, p, lanIP(t, cur)})
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("parallel ADD on %d nodes: %v", len(nodes), err)
	}
	seen := map[string]bool{}
	for _, p := range all {
		if seen[p.ip] {
			t.Fatalf("LAN address %s handed out twice across nodes", p.ip)
		}
		seen[p.ip] = true
	}
	return all
}
