package overlay

import (
	"net"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// wgPeers marks a peer Hub when its record says so or the config names
// it, and marks none when this node is a hub itself (by either): a hub
// reaches every peer directly.
func TestWireGuardHubMarks(t *testing.T) {
	subnet := func(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }
	key := func(b byte) wgtypes.Key { var k wgtypes.Key; k[0] = b; return k }
	peers := []Node{
		{Name: "vps", IP: net.ParseIP("192.0.2.1"), PodCIDRs: []*net.IPNet{subnet("10.70.1.0/24")}, WireGuardKey: key(1), WireGuardHub: true},
		{Name: "vps-2", IP: net.ParseIP("192.0.2.2"), PodCIDRs: []*net.IPNet{subnet("10.70.2.0/24")}, WireGuardKey: key(2)},
		{Name: "home", IP: net.ParseIP("10.79.0.12"), PodCIDRs: []*net.IPNet{subnet("10.70.3.0/24")}, WireGuardKey: key(3)},
	}
	d := desired{routes: map[string]route{}}
	for _, p := range peers {
		d.routes[p.PodCIDRs[0].String()] = route{peer: p.Name, dst: p.PodCIDRs[0]}
	}
	for _, c := range []struct {
		name string
		hubs []string // the config's
		self Node
		want map[string]bool
	}{
		{"the label", nil, Node{Name: "home-2"}, map[string]bool{"vps": true}},
		{"the label and the config", []string{"vps-2"}, Node{Name: "home-2"}, map[string]bool{"vps": true, "vps-2": true}},
		{"self labelled a hub", nil, Node{Name: "vps-3", WireGuardHub: true}, map[string]bool{}},
		{"self named a hub", []string{"home-2"}, Node{Name: "home-2"}, map[string]bool{}},
	} {
		r := &Reconciler{cfg: Config{Port: 51820, WireGuard: WireGuardConfig{Hubs: c.hubs, PersistentKeepalive: 25 * time.Second}}}
		got := map[string]bool{}
		for _, p := range r.wgPeers(d, c.self, peers) {
			for _, n := range peers {
				if n.WireGuardKey == p.PublicKey && p.Hub {
					got[n.Name] = true
				}
			}
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: hubs %v, want %v", c.name, got, c.want)
			continue
		}
		for n := range c.want {
			if !got[n] {
				t.Errorf("%s: hubs %v, want %v", c.name, got, c.want)
			}
		}
	}
}
