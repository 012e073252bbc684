package agent

import (
	"net"
	"testing"

	"github.com/village-cni/village/pkg/overlay"
)

func TestDiffPeers(t *testing.T) {
	cidr := func(s string) []*net.IPNet { _, n, _ := net.ParseCIDR(s); return []*net.IPNet{n} }
	a := overlay.Node{Name: "a", IP: net.ParseIP("192.168.1.1"), PodCIDRs: cidr("10.0.1.0/24")}
	b := overlay.Node{Name: "b", IP: net.ParseIP("192.168.1.2"), PodCIDRs: cidr("10.0.2.0/24")}
	b2 := overlay.Node{Name: "b", IP: net.ParseIP("192.168.1.9"), PodCIDRs: cidr("10.0.2.0/24")}
	c := overlay.Node{Name: "c", IP: net.ParseIP("192.168.1.3"), PodCIDRs: cidr("10.0.3.0/24")}

	ch := diffPeers([]overlay.Node{a, b}, []overlay.Node{b2, c})
	if len(ch.Added) != 1 || ch.Added[0].Name != "c" {
		t.Fatalf("added %+v", ch.Added)
	}
	if len(ch.Updated) != 1 || !ch.Updated[0].IP.Equal(b2.IP) {
		t.Fatalf("updated %+v", ch.Updated)
	}
	if len(ch.Removed) != 1 || ch.Removed[0].Name != "a" {
		t.Fatalf("removed %+v", ch.Removed)
	}
	if ch := diffPeers([]overlay.Node{a, b}, []overlay.Node{b, a}); len(ch.Added)+len(ch.Updated)+len(ch.Removed) != 0 {
		t.Fatalf("same set in another order is no change: %+v", ch)
	}
}
