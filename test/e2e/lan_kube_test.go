package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
)

// TestSharedLANPoolThroughKubernetes: the LAN layout of the etcd test with
// the pool kept in a real kube-apiserver (on the LAN host) instead:
// village-ipam execs village-ipam-kube, which keeps one Lease per address.
// 12 pods on two nodes, all added at once, get 12 distinct addresses of a
// 12-address range; the 13th ADD fails; DEL frees the addresses.
func TestSharedLANPoolThroughKubernetes(t *testing.T) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", "192.168.77.5/24")
	kube := kubetest.Start(t, kubetest.Options{NetNS: host, IP: "192.168.77.5"})

	nodes, lists := sharedLANNodes(t, lan, "10.53", func(i int) string {
		return fmt.Sprintf(`,"store":{"type":"kubernetes","kubeconfig":%q,"namespace":"default","nodeName":"node%d"}`, kube.AdminKubeconfig, i)
	})
	all := addLANPodsAtOnce(t, nodes, lists, 12)
	leases, err := kube.Client.CoordinationV1().Leases("default").List(context.Background(), metav1.ListOptions{LabelSelector: "village.cni.io/ipam-kind=address"})
	must(t, err, "listing the allocation Leases")
	if len(leases.Items) != 12 {
		t.Fatalf("%d allocation Leases, want 12", len(leases.Items))
	}
	pingAcrossNodes(t, all)

	extra := nodes[0].NewPod()
	if _, err := nodes[0].Add(lists[0], extra); err == nil || !strings.Contains(err.Error(), "192.168.77.200") {
		t.Fatalf("ADD past the shared range: %v", err)
	}
	victim := all[0]
	must(t, nodes[victim.node].Del(lists[victim.node], victim.pod), "DEL")
	r := nodes[0].MustAdd(lists[0], extra)
	if ip := lanIP(t, r); ip != victim.ip {
		t.Fatalf("the only free LAN address is %s, got %s", victim.ip, ip)
	}
}
