package kube

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/pkg/ipam/allocator/stickytest"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/storetest"
)

var nets atomic.Int64

// open makes a store of a new network (so it starts empty) on kube.
func open(t *testing.T, kube *kubetest.Server, node string) *Store {
	s, err := New(Options{Client: kube.Client, Network: fmt.Sprintf("net%d", nets.Add(1)), NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKubeStore runs everything against one real API server.
func TestKubeStore(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store { return open(t, kube, "n1") })
	})
	t.Run("Sticky", func(t *testing.T) {
		var network string
		stickytest.Run(t, func(t *testing.T, node string) store.Store {
			if node == "a" {
				network = fmt.Sprintf("net%d", nets.Add(1))
			}
			s, err := New(Options{Client: kube.Client, Network: network, NodeName: node})
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
	t.Run("TwoNodesNeverShareAnAddress", func(t *testing.T) { twoNodes(t, kube) })
	t.Run("DeletedNodeReleased", func(t *testing.T) { deletedNode(t, kube) })
}

// Two nodes claiming one pool in parallel never get the same address.
func twoNodes(t *testing.T, kube *kubetest.Server) {
	a := open(t, kube, "node-a")
	b, err := New(Options{Client: kube.Client, Network: a.net, NodeName: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var mu sync.Mutex
	holders := map[netip.Addr]string{}
	var wg sync.WaitGroup
	for i, s := range []*Store{a, b, a, b} {
		wg.Go(func() {
			for k := range 20 {
				ip := netip.AddrFrom4([4]byte{192, 168, 77, byte(10 + k)})
				ok, err := s.Claim(ctx, store.Claim{IP: ip, Owner: store.Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "net1"}})
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					if h, dup := holders[ip]; dup {
						t.Errorf("%s handed out twice (%s and %s)", ip, h, s.node)
					}
					holders[ip] = s.node
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	all, err := a.List(ctx)
	if err != nil || len(all) != 20 || len(holders) != 20 {
		t.Fatalf("List: %d allocations (%v), %d claims won; want 20", len(all), err, len(holders))
	}
}

// A deleted Node's pod allocations are released by GC on another node (the
// garbage collector would also delete them through the ownerReference); a
// Service's allocation that the Node wrote stays (it has no ownerReference
// for the garbage collector either).
func deletedNode(t *testing.T, kube *kubetest.Server) {
	ctx := context.Background()
	for _, n := range []string{"gone-node", "live-node"} {
		if _, err := kube.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gone := open(t, kube, "gone-node")
	live, err := New(Options{Client: kube.Client, Network: gone.net, NodeName: "live-node"})
	if err != nil {
		t.Fatal(err)
	}
	ipG, ipL := netip.MustParseAddr("192.168.77.50"), netip.MustParseAddr("192.168.77.51")
	o := store.Owner{ContainerID: "c1", IfName: "net1"}
	if ok, err := gone.Claim(ctx, store.Claim{IP: ipG, Owner: o}); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	// A LAN Service's address that the soon-gone node happened to write.
	ipS := netip.MustParseAddr("192.168.77.52")
	svc := store.Owner{ContainerID: store.ServiceOwnerPrefix + "home_web", IfName: "svc"}
	if ok, err := gone.Claim(ctx, store.Claim{IP: ipS, Owner: svc}); !ok || err != nil {
		t.Fatalf("claim for a Service: %v %v", ok, err)
	}
	if l, err := kube.Client.CoordinationV1().Leases(DefaultNamespace).Get(ctx, gone.name(ipS), metav1.GetOptions{}); err != nil || len(l.OwnerReferences) != 0 {
		t.Fatalf("a Service's allocation Lease must not die with the Node that wrote it: ownerReferences %v (%v)", l.OwnerReferences, err)
	}
	if ok, err := live.Claim(ctx, store.Claim{IP: ipL, Owner: o}); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	l, err := kube.Client.CoordinationV1().Leases(DefaultNamespace).Get(ctx, gone.name(ipG), metav1.GetOptions{})
	if err != nil || len(l.OwnerReferences) != 1 || l.OwnerReferences[0].Kind != "Node" || l.OwnerReferences[0].Name != "gone-node" {
		t.Fatalf("allocation Lease %v has no ownerReference to its Node: %v", l, err)
	}
	// While the Node exists, another node's GC leaves it alone.
	if rel, err := live.GC(ctx, store.Valid([]store.Owner{o})); err != nil || len(rel) != 0 {
		t.Fatalf("GC with both Nodes present released %v (%v)", rel, err)
	}
	if err := kube.Client.CoreV1().Nodes().Delete(ctx, "gone-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rel, err := live.GC(ctx, store.Valid([]store.Owner{o}))
	if err != nil || len(rel) != 1 || rel[0].IP != ipG {
		t.Fatalf("GC after the Node was deleted released %v (%v), want %s", rel, err, ipG)
	}
	if ok, err := live.Claim(ctx, store.Claim{IP: ipG, Owner: store.Owner{ContainerID: "c2", IfName: "net1"}}); !ok || err != nil {
		t.Fatalf("the deleted Node's address cannot be claimed again: %v %v", ok, err)
	}
	if got, _ := live.ListByOwner(ctx, o); len(got) != 1 || got[0] != ipL {
		t.Fatalf("live node's own allocation: %v", got)
	}
	// The Service's address outlives the Node that wrote it: still
	// listed for the Service, and nobody else can claim it.
	if got, err := live.ListByOwner(ctx, svc); err != nil || len(got) != 1 || got[0] != ipS {
		t.Fatalf("the Service's allocation after its writer's Node was deleted: %v (%v), want %s", got, err, ipS)
	}
	if ok, err := live.Claim(ctx, store.Claim{IP: ipS, Owner: store.Owner{ContainerID: "c3", IfName: "net1"}}); ok || err != nil {
		t.Fatalf("the Service's address was handed to a pod: %v %v", ok, err)
	}
}

func TestNames(t *testing.T) {
	s := &Store{netHash: "0123456789abcdef"}
	for ip, want := range map[string]string{
		"192.168.77.5": "village-ipam-0123456789abcdef-192.168.77.5",
		"fd00::1":      "village-ipam-0123456789abcdef-fd00-0000-0000-0000-0000-0000-0000-0001",
		"::1":          "village-ipam-0123456789abcdef-0000-0000-0000-0000-0000-0000-0000-0001",
	} {
		if got := s.name(netip.MustParseAddr(ip)); got != want {
			t.Errorf("name(%s) = %s, want %s", ip, got, want)
		}
	}
}
