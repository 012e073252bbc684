package overlay_test

import (
	"net"
	"testing"

	"github.com/village-cni/village/pkg/overlay"
)

// TestDiff: the one comparison of peer sets, by name; records that say the
// same node in other bytes (a 16-byte IPv4 address, an empty MAC for none)
// are no change; a new address, MAC or pod subnet is.
func TestDiff(t *testing.T) {
	cidr := func(s string) []*net.IPNet { _, n, _ := net.ParseCIDR(s); return []*net.IPNet{n} }
	a := overlay.Node{Name: "a", IP: net.ParseIP("192.168.1.1"), PodCIDRs: cidr("10.0.1.0/24")}
	b := overlay.Node{Name: "b", IP: net.ParseIP("192.168.1.2"), PodCIDRs: cidr("10.0.2.0/24")}
	b2 := overlay.Node{Name: "b", IP: net.ParseIP("192.168.1.9"), PodCIDRs: cidr("10.0.2.0/24")}
	c := overlay.Node{Name: "c", IP: net.ParseIP("192.168.1.3"), PodCIDRs: cidr("10.0.3.0/24")}

	ch := overlay.Diff([]overlay.Node{a, b}, []overlay.Node{c, b2})
	if len(ch.Added) != 1 || ch.Added[0].Name != "c" {
		t.Fatalf("added %+v", ch.Added)
	}
	if len(ch.Updated) != 1 || !ch.Updated[0].IP.Equal(b2.IP) {
		t.Fatalf("updated %+v", ch.Updated)
	}
	if len(ch.Removed) != 1 || ch.Removed[0].Name != "a" {
		t.Fatalf("removed %+v", ch.Removed)
	}
	same := b
	same.IP = same.IP.To16()
	same.VtepMAC = net.HardwareAddr{}
	if ch := overlay.Diff([]overlay.Node{a, b}, []overlay.Node{same, a}); !ch.Empty() {
		t.Fatalf("same set in another order and other bytes is no change: %+v", ch)
	}
	for what, n := range map[string]overlay.Node{
		"MAC":        {Name: "b", IP: b.IP, PodCIDRs: b.PodCIDRs, VtepMAC: net.HardwareAddr{0x0e, 0, 0, 0, 0, 1}},
		"pod subnet": {Name: "b", IP: b.IP, PodCIDRs: cidr("10.0.9.0/24")},
		"no subnet":  {Name: "b", IP: b.IP},
	} {
		if ch := overlay.Diff([]overlay.Node{b}, []overlay.Node{n}); len(ch.Updated) != 1 || ch.Empty() {
			t.Errorf("%s changed: %+v", what, ch)
		}
	}
}
