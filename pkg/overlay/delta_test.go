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

// TestDrifts: a notification is drift only when it leaves the kernel
// differing from the baseline's plan; the reconciler's own writes (the
// plan itself) and other owners' objects away from it are not.
func TestDrifts(t *testing.T) {
	lan := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: 4, Name: "lan0", MTU: 1500}}
	e := env{u: underlay{link: lan, ip: net.IPv4(192, 168, 77, 1).To4()}, vtep: linkRef{index: 9, name: "village.1"}, metric: 7}
	self := Node{Name: "self", IP: e.u.ip, PodCIDRs: []*net.IPNet{{IP: net.IPv4(10, 200, 0, 0).To4(), Mask: net.CIDRMask(24, 32)}}}
	p := Node{Name: "p1", IP: net.IPv4(10, 60, 0, 1).To4(), PodCIDRs: []*net.IPNet{{IP: net.IPv4(10, 200, 1, 0).To4(), Mask: net.CIDRMask(24, 32)}}}
	r := &Reconciler{metric: 7}
	del := func(rt *netlink.Route, n *netlink.Neigh) KernelEvent {
		return KernelEvent{Deleted: true, Route: rt, Neigh: n}
	}
	for _, tc := range []struct {
		what string
		ev   KernelEvent
		want bool
	}{
		{"a deletion", del(&netlink.Route{Dst: p.PodCIDRs[0], Protocol: RouteProtocol, Priority: 7}, nil), true},
		{"a new route", KernelEvent{Route: &netlink.Route{Dst: p.PodCIDRs[0], Protocol: RouteProtocol, Priority: 7}}, false},
		{"a link", KernelEvent{LinkIndex: 9}, false},
	} {
		if got := r.Drifts(tc.ev); got != tc.want {
			t.Errorf("without a baseline, %s: Drifts %v, want %v", tc.what, got, tc.want)
		}
	}

	b := &baseline{mode: ModeVXLAN, self: self, e: e}
	d, problems := plan(vxlanBackend{}, e, self, []Node{p})
	b.reset(map[string]Node{p.Name: p}, d, problems)
	r.base = b
	held := &net.IPNet{IP: net.IPv4(10, 200, 3, 0).To4(), Mask: net.CIDRMask(24, 32)}
	b.d.held[objKey(KindRoute, held.String())] = true
	mac := DeriveMAC(p.IP)
	other := &net.IPNet{IP: net.IPv4(10, 200, 2, 0).To4(), Mask: net.CIDRMask(24, 32)}
	vtepIP := net.IPv4(10, 200, 1, 0).To4()
	planned := *b.d.routes[p.PodCIDRs[0].String()].spec()
	moved := planned
	moved.Gw = net.IPv4(10, 200, 9, 0).To4()
	stray := planned
	stray.Dst = other
	foreign := netlink.Route{Dst: p.PodCIDRs[0], Protocol: unix.RTPROT_BOOT, Priority: 0, Table: unix.RT_TABLE_MAIN}
	behind := foreign
	behind.Priority = 100
	elsewhere := foreign
	elsewhere.Dst = other
	otherNet := planned
	otherNet.Dst, otherNet.Priority = other, 8
	dflt := netlink.Route{Protocol: unix.RTPROT_BOOT, Table: unix.RT_TABLE_MAIN, LinkIndex: 4}
	neighAs := func(ip net.IP, m net.HardwareAddr, state, link int) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: link, Family: netlink.FAMILY_V4, State: state, IP: ip, HardwareAddr: m}
	}
	fdbAs := func(m net.HardwareAddr, dst net.IP, link int) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: link, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, IP: dst, HardwareAddr: m}
	}
	otherMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	perm := netlink.NUD_PERMANENT
	// the VXLAN device as a pass leaves it, and as it may be found
	spec := r.vtepSpecFor(e.u, self)
	settled := spec.link()
	settled.Index, settled.Alias, settled.Flags = 9, spec.alias, net.FlagUp
	down, otherMTU, learning := *settled, *settled, *settled
	down.Flags = 0
	otherMTU.MTU--
	learning.Learning = true
	ownAddr := &net.IPNet{IP: net.IPv4(10, 200, 0, 0).To4(), Mask: net.CIDRMask(32, 32)}
	strayAddr := &net.IPNet{IP: net.IPv4(10, 200, 7, 0).To4(), Mask: net.CIDRMask(32, 32)}
	for _, tc := range []struct {
		what string
		ev   KernelEvent
		want bool
	}{
		// deletions
		{"planned route deleted", del(&planned, nil), true},
		{"route no longer planned deleted", del(&stray, nil), false},
		{"another network's route deleted", del(&otherNet, nil), false},
		{"someone else's route at a planned destination deleted", del(&foreign, nil), false},
		{"the route in front of a held peer's deleted", del(&netlink.Route{Dst: held, Protocol: unix.RTPROT_BOOT}, nil), true},
		{"planned neighbour deleted", del(nil, neighAs(vtepIP, mac, perm, 9)), true},
		{"planned neighbour deleted, reported FAILED as the kernel does", del(nil, neighAs(vtepIP, mac, netlink.NUD_FAILED, 9)), true},
		{"old neighbour deleted", del(nil, neighAs(other.IP, mac, perm, 9)), false},
		{"planned FDB entry deleted", del(nil, fdbAs(mac, p.IP, 9)), true},
		{"FDB entry's old destination deleted", del(nil, fdbAs(mac, net.IPv4(10, 61, 0, 1).To4(), 9)), false},
		{"an entry on another device deleted", del(nil, neighAs(vtepIP, mac, perm, 3)), false},
		{"a route of before the metrics deleted", del(&netlink.Route{Dst: other, Protocol: RouteProtocol, Priority: 0}, nil), true},
		// additions and changes
		{"the planned route (our own write)", KernelEvent{Route: &planned}, false},
		{"the planned route changed by hand", KernelEvent{Route: &moved}, true},
		{"our route at a destination the plan does not have", KernelEvent{Route: &stray}, true},
		{"someone else's route in front of a planned one", KernelEvent{Route: &foreign}, true},
		{"someone else's route behind a planned one", KernelEvent{Route: &behind}, false},
		{"someone else's route elsewhere", KernelEvent{Route: &elsewhere}, false},
		{"another network's route", KernelEvent{Route: &otherNet}, false},
		{"a default route (the underlay is the default route's link)", KernelEvent{Route: &dflt}, true},
		{"the planned neighbour (our own write)", KernelEvent{Neigh: neighAs(vtepIP, mac, perm, 9)}, false},
		{"the planned neighbour with another MAC", KernelEvent{Neigh: neighAs(vtepIP, otherMAC, perm, 9)}, true},
		{"a permanent neighbour the plan does not have", KernelEvent{Neigh: neighAs(other.IP, mac, perm, 9)}, true},
		{"a neighbour the kernel made", KernelEvent{Neigh: neighAs(other.IP, mac, netlink.NUD_REACHABLE, 9)}, false},
		{"a neighbour on another device", KernelEvent{Neigh: neighAs(vtepIP, otherMAC, perm, 3)}, false},
		{"the planned FDB entry (our own write)", KernelEvent{Neigh: fdbAs(mac, p.IP, 9)}, false},
		{"the planned FDB entry to another destination", KernelEvent{Neigh: fdbAs(mac, net.IPv4(10, 61, 0, 1).To4(), 9)}, true},
		{"a permanent FDB entry the plan does not have", KernelEvent{Neigh: fdbAs(otherMAC, p.IP, 9)}, true},
		{"the VXLAN device, not said how", KernelEvent{LinkIndex: 9}, true},
		{"the VXLAN device as a pass leaves it (our own link up)", KernelEvent{LinkIndex: 9, Link: settled}, false},
		{"the VXLAN device down", KernelEvent{LinkIndex: 9, Link: &down}, true},
		{"the VXLAN device with another MTU", KernelEvent{LinkIndex: 9, Link: &otherMTU}, true},
		{"the VXLAN device learning", KernelEvent{LinkIndex: 9, Link: &learning}, true},
		{"the VXLAN device deleted", KernelEvent{Deleted: true, LinkIndex: 9, Link: settled}, true},
		{"the VXLAN device's address (our own write)", KernelEvent{LinkIndex: 9, Addr: ownAddr}, false},
		{"the VXLAN device's address deleted", KernelEvent{Deleted: true, LinkIndex: 9, Addr: ownAddr}, true},
		{"another address on the VXLAN device", KernelEvent{LinkIndex: 9, Addr: strayAddr}, true},
		{"another address on the VXLAN device deleted", KernelEvent{Deleted: true, LinkIndex: 9, Addr: strayAddr}, false},
		{"the underlay link", KernelEvent{LinkIndex: 4}, true},
		{"another link", KernelEvent{LinkIndex: 3}, false},
		{"an address on the underlay", KernelEvent{LinkIndex: 4, Addr: &net.IPNet{IP: net.IPv4(192, 168, 77, 2).To4(), Mask: net.CIDRMask(24, 32)}}, true},
		{"a link-local address on the VXLAN device", KernelEvent{LinkIndex: 9, Addr: &net.IPNet{IP: net.ParseIP("fe80::1"), Mask: net.CIDRMask(64, 128)}}, false},
	} {
		if got := r.Drifts(tc.ev); got != tc.want {
			t.Errorf("%s: Drifts %v, want %v", tc.what, got, tc.want)
		}
	}
	r.cfg.Underlay = "lan0"
	if r.Drifts(KernelEvent{Route: &dflt}) {
		t.Error("a default route changed with a configured underlay interface: Drifts true")
	}
}
