package overlay

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestPlanDelta: a change is planned alone exactly when that is the whole
// set's plan restricted to it (the last plan clean, no key of an untouched
// peer taken), and committing it leaves the baseline equal to the plan of
// the whole new set.
func TestPlanDelta(t *testing.T) {
	e := env{u: underlay{ip: net.IPv4(192, 168, 77, 1).To4()}, vtep: linkRef{index: 9, name: "village.1"}, metric: 7}
	self := Node{Name: "self", IP: e.u.ip}
	peer := func(i, subnet int) Node {
		return Node{Name: fmt.Sprintf("p%d", i), IP: net.IPv4(10, 60, 0, byte(i)).To4(),
			PodCIDRs: []*net.IPNet{{IP: net.IPv4(10, 200, byte(subnet), 0).To4(), Mask: net.CIDRMask(24, 32)}}}
	}
	base := func() *baseline {
		peers := map[string]Node{}
		for i := 1; i <= 4; i++ {
			peers[peer(i, i).Name] = peer(i, i)
		}
		b := &baseline{mode: ModeVXLAN, self: self, e: e}
		d, problems := plan(vxlanBackend{}, e, self, mapValues(peers))
		b.reset(peers, d, problems)
		return b
	}
	for _, tc := range []struct {
		what   string
		change PeerChange
		alone  bool
	}{
		{"one added", PeerChange{Added: []Node{peer(5, 5)}}, true},
		{"one moved", PeerChange{Updated: []Node{{Name: "p2", IP: net.IPv4(10, 61, 0, 2).To4(), PodCIDRs: peer(2, 2).PodCIDRs}}}, true},
		{"two swap subnets", PeerChange{Updated: []Node{peer(1, 2), peer(2, 1)}}, true},
		{"removed and its subnet taken", PeerChange{Removed: []Node{{Name: "p3"}}, Added: []Node{peer(6, 3)}}, true},
		{"takes an untouched peer's subnet", PeerChange{Added: []Node{peer(7, 4)}}, false},
		{"cannot be planned (no address)", PeerChange{Added: []Node{{Name: "p8"}}}, false},
	} {
		b := base()
		touched := touchedBy(tc.change)
		nd, ok := b.planDelta(touched)
		if ok != tc.alone {
			t.Errorf("%s: planned alone %v, want %v", tc.what, ok, tc.alone)
			continue
		}
		if !ok {
			continue
		}
		b.commitDelta(touched, nd)
		want, _ := plan(vxlanBackend{}, e, self, mapValues(b.peers))
		if got, exp := render(b.d), render(want); got != exp {
			t.Errorf("%s: baseline after the change\n%s\nwhole-set plan\n%s", tc.what, got, exp)
		}
		fresh := &baseline{}
		fresh.reset(b.peers, want, nil)
		if got, exp := len(flatten(b.byPeer)), len(flatten(fresh.byPeer)); got != exp {
			t.Errorf("%s: %d indexed objects, want %d", tc.what, got, exp)
		}
	}
}

// render lists a plan's objects in words, in key order.
func render(d desired) string {
	var b strings.Builder
	for _, k := range sortedKeys(d.routes) {
		fmt.Fprintln(&b, d.routes[k].object())
	}
	for _, k := range sortedKeys(d.neighs) {
		fmt.Fprintln(&b, d.neighs[k].object())
	}
	for _, k := range sortedKeys(d.fdbs) {
		fmt.Fprintln(&b, d.fdbs[k].object())
	}
	return b.String()
}

func mapValues(m map[string]Node) []Node {
	out := make([]Node, 0, len(m))
	for _, n := range m {
		out = append(out, n)
	}
	return out
}

func flatten(m map[string][]objRef) []objRef {
	var out []objRef
	for _, refs := range m {
		out = append(out, refs...)
	}
	return out
}

// TestWanted: a deletion is drift only for what the baseline plans.
func TestWanted(t *testing.T) {
	e := env{u: underlay{ip: net.IPv4(192, 168, 77, 1).To4()}, vtep: linkRef{index: 9, name: "village.1"}, metric: 7}
	self := Node{Name: "self", IP: e.u.ip}
	p := Node{Name: "p1", IP: net.IPv4(10, 60, 0, 1).To4(), PodCIDRs: []*net.IPNet{{IP: net.IPv4(10, 200, 1, 0).To4(), Mask: net.CIDRMask(24, 32)}}}
	r := &Reconciler{metric: 7}
	if !r.Wanted(&netlink.Route{Dst: p.PodCIDRs[0], Priority: 7}, nil) {
		t.Error("without a baseline every deletion is drift")
	}
	b := &baseline{mode: ModeVXLAN, self: self, e: e}
	d, problems := plan(vxlanBackend{}, e, self, []Node{p})
	b.reset(map[string]Node{p.Name: p}, d, problems)
	r.base = b
	mac := DeriveMAC(p.IP)
	other := &net.IPNet{IP: net.IPv4(10, 200, 2, 0).To4(), Mask: net.CIDRMask(24, 32)}
	for _, tc := range []struct {
		what string
		rt   *netlink.Route
		n    *netlink.Neigh
		want bool
	}{
		{"planned route", &netlink.Route{Dst: p.PodCIDRs[0], Priority: 7}, nil, true},
		{"route no longer planned", &netlink.Route{Dst: other, Priority: 7}, nil, false},
		{"another network's route", &netlink.Route{Dst: p.PodCIDRs[0], Priority: 8}, nil, false},
		{"planned neighbour", nil, &netlink.Neigh{LinkIndex: 9, IP: net.IPv4(10, 200, 1, 0).To4(), HardwareAddr: mac}, true},
		{"old neighbour", nil, &netlink.Neigh{LinkIndex: 9, IP: net.IPv4(10, 200, 2, 0).To4(), HardwareAddr: mac}, false},
		{"planned FDB entry", nil, &netlink.Neigh{LinkIndex: 9, Family: unix.AF_BRIDGE, IP: p.IP, HardwareAddr: mac}, true},
		{"FDB entry's old destination", nil, &netlink.Neigh{LinkIndex: 9, Family: unix.AF_BRIDGE, IP: net.IPv4(10, 61, 0, 1).To4(), HardwareAddr: mac}, false},
		{"entry on another device", nil, &netlink.Neigh{LinkIndex: 3, Family: unix.AF_BRIDGE, HardwareAddr: mac}, true},
	} {
		if got := r.Wanted(tc.rt, tc.n); got != tc.want {
			t.Errorf("%s: Wanted %v, want %v", tc.what, got, tc.want)
		}
	}
}
