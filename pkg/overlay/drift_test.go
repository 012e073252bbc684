package overlay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

func changeSet(cs []overlay.Change) map[string]int {
	m := map[string]int{}
	for _, c := range cs {
		m[fmt.Sprintf("%s %s", c.Op, c.Object.Kind)]++
	}
	return m
}

func sameCounts(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TestDriftRepair: objects deleted or changed by hand are reported by Status
// and restored by the next Set, which touches nothing else.
func TestDriftRepair(t *testing.T) {
	_, nodes := threeNodes(t)
	nodes = nodes[:2]
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeVXLAN}, false)
	c.setAll(t)
	ctx := context.Background()
	self, all := nodes[0].node(false), c.all()
	r := c.recs[0]
	if d, err := r.Status(ctx, self, all); err != nil || !d.Clean() {
		t.Fatalf("Status right after Set: %v, %v", d, err)
	}
	before := readState(t, nodes[0].ns, "village.1")
	peerMAC := overlay.DeriveMAC(nodes[1].ip4).String()
	testenv.MustIP(t, nodes[0].ns, "route", "del", "10.244.2.0/24", "dev", "village.1")
	testenv.MustIP(t, nodes[0].ns, "neigh", "del", "10.244.2.0", "dev", "village.1")
	sh(t, nodes[0].ns, "bridge", "fdb", "del", peerMAC, "dev", "village.1", "dst", "192.168.77.12")
	testenv.MustIP(t, nodes[0].ns, "neigh", "replace", "fd44:2::", "lladdr", "0e:00:00:00:00:01", "dev", "village.1", "nud", "permanent")
	testenv.MustIP(t, nodes[0].ns, "link", "set", "village.1", "mtu", "1400")

	d, err := r.Status(ctx, self, all)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"add route": 1, "add neigh": 1, "add fdb": 1, "replace neigh": 1, "replace device": 1}
	if !sameCounts(changeSet(d.Changes), want) {
		t.Fatalf("Status drift = \n%v\nwant %v", d, want)
	}
	if !strings.Contains(d.String(), "add route 10.244.2.0/24 via 10.244.2.0 dev village.1 onlink (peer node2)") {
		t.Errorf("drift does not name the route and peer:\n%v", d)
	}
	rep, err := r.Set(ctx, self, all)
	if err != nil {
		t.Fatal(err)
	}
	if !sameCounts(changeSet(rep.Applied), want) {
		t.Errorf("Set applied %v, want %v", rep.Applied, want)
	}
	if after := readState(t, nodes[0].ns, "village.1"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("state after repair = %+v\nwant %+v", after, before)
	}
	if d, err := r.Status(ctx, self, all); err != nil || !d.Clean() {
		t.Errorf("Status after repair: %v, %v", d, err)
	}
	c.pingAll(t)
}

// TestPeerRemoved: a peer left out of the set loses its route, neighbour and
// FDB entries; the others are not touched.
func TestPeerRemoved(t *testing.T) {
	_, nodes := threeNodes(t)
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeVXLAN}, false)
	c.setAll(t)
	ctx := context.Background()
	rep, err := c.recs[0].Set(ctx, nodes[0].node(false), c.all()[:2])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"delete route": 2, "delete neigh": 2, "delete fdb": 1}
	if !sameCounts(changeSet(rep.Applied), want) {
		t.Errorf("applied %v, want %v", rep.Applied, want)
	}
	st := readState(t, nodes[0].ns, "village.1")
	for _, s := range append(append(st.Routes, st.Neighs...), st.FDB...) {
		if strings.Contains(s, "10.244.3.") || strings.Contains(s, "fd44:3:") || strings.Contains(s, "192.168.77.13") {
			t.Errorf("node3's object is still there: %s", s)
		}
	}
	if len(st.Routes) != 2 || len(st.Neighs) != 2 || len(st.FDB) != 1 {
		t.Errorf("state = %+v, want node2's 2 routes, 2 neighbours, 1 FDB entry", st)
	}
	if err := testenv.Ping(nodes[0].pod, nodes[1].pod4, 1); err != nil {
		t.Error(err)
	}
}

// TestForeignRoutesUntouched: routes of other protocols (and other
// networks' VXLAN devices) survive Set, a mode switch and Teardown; a foreign
// route where a peer route would go is a conflict naming the peer.
func TestForeignRoutesUntouched(t *testing.T) {
	_, nodes := threeNodes(t)
	n := nodes[0]
	foreign := [][]string{
		{"route", "add", "10.99.0.0/24", "via", "192.168.77.12", "dev", "eth0", "proto", "static"},
		{"route", "add", "10.98.0.0/24", "dev", "pod0", "proto", "boot"},
		{"route", "add", "10.244.3.0/24", "via", "192.168.77.13", "dev", "eth0", "proto", "static"},
		{"link", "add", "village.9", "type", "vxlan", "id", "9", "dstport", "4789", "nolearning", "dev", "eth0"},
		{"link", "set", "village.9", "up"},
		{"route", "add", "10.97.0.0/24", "via", "10.97.0.0", "dev", "village.9", "onlink", "proto", "86"},
	}
	for _, args := range foreign {
		testenv.MustIP(t, n.ns, args...)
	}
	snapshot := func() string {
		out := testenv.MustIP(t, n.ns, "route", "show", "table", "main")
		var keep []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "10.99.") || strings.Contains(l, "10.98.") || strings.Contains(l, "10.97.") ||
				(strings.Contains(l, "10.244.3.0") && strings.Contains(l, "static")) {
				keep = append(keep, strings.TrimSpace(l))
			}
		}
		return strings.Join(keep, "\n")
	}
	orig := snapshot()
	if strings.Count(orig, "\n") != 3 {
		t.Fatalf("foreign routes not all there:\n%s", orig)
	}
	ctx := context.Background()
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeVXLAN}, false)
	rep, err := c.recs[0].Set(ctx, n.node(false), c.all())
	if !errors.Is(err, overlay.ErrConflict) || !strings.Contains(err.Error(), "node3") || !strings.Contains(err.Error(), "10.244.3.0/24") {
		t.Errorf("Set error %v: want ErrConflict naming node3 and 10.244.3.0/24", err)
	}
	if len(rep.Failed) != 1 || len(rep.Applied) == 0 {
		t.Errorf("report: %d applied, failed %v; want the rest applied and one failure", len(rep.Applied), rep.Failed)
	}
	for _, step := range []func() error{
		func() error { _, err := c.recs[0].Set(ctx, n.node(false), c.all()[:2]); return err },
		func() error {
			r := newReconciler(t, n.ns, overlay.Config{Mode: overlay.ModeHostGW})
			_, err := r.Set(ctx, n.node(false), nil)
			return err
		},
		func() error { _, err := c.recs[0].Teardown(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		if now := snapshot(); now != orig {
			t.Errorf("foreign routes changed:\n%s\nwant\n%s", now, orig)
		}
	}
	if out := testenv.MustIP(t, n.ns, "link", "show"); strings.Contains(out, "village.1:") || !strings.Contains(out, "village.9") {
		t.Errorf("after teardown want village.9 only:\n%s", out)
	}
}

// TestTeardown removes every owned object; a second Teardown does nothing.
func TestTeardown(t *testing.T) {
	_, nodes := threeNodes(t)
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeAuto}, false)
	c.setAll(t)
	ctx := context.Background()
	rep, err := c.recs[0].Teardown(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Applied) == 0 {
		t.Error("teardown applied nothing")
	}
	if st := readState(t, nodes[0].ns, "village.1"); len(st.Routes)+len(st.Neighs)+len(st.FDB) != 0 {
		t.Errorf("left after teardown: %+v", st)
	}
	if rep, err := c.recs[0].Teardown(ctx); err != nil || len(rep.Applied) != 0 {
		t.Errorf("second teardown: %v, %v", rep.Applied, err)
	}
}

// TestOneChangeTouchesOnePeer: on top of many peers, adding, changing or
// removing one peer writes only that peer's objects.
func TestOneChangeTouchesOnePeer(t *testing.T) {
	_, nodes := threeNodes(t)
	r := newReconciler(t, nodes[0].ns, overlay.Config{Mode: overlay.ModeVXLAN})
	ctx := context.Background()
	self := nodes[0].node(false)
	peers := fakePeers(200)
	if _, err := r.Set(ctx, self, peers); err != nil {
		t.Fatal(err)
	}
	check := func(what string, peers []overlay.Node, name string, want map[string]int) {
		t.Helper()
		rep, err := r.Set(ctx, self, peers)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !sameCounts(changeSet(rep.Applied), want) {
			t.Errorf("%s applied %v, want %v", what, rep.Applied, want)
		}
		for _, c := range rep.Applied {
			if c.Object.Peer != "" && c.Object.Peer != name {
				t.Errorf("%s touched %s", what, c)
			}
		}
	}
	added := append(peers, fakePeer(200))
	check("adding a peer", added, "peer200", map[string]int{"add route": 1, "add neigh": 1, "add fdb": 1})
	moved := append([]overlay.Node(nil), added...)
	moved[10].IP = net.ParseIP("10.61.0.99") // not another peer's address
	check("moving a peer", moved, moved[10].Name, map[string]int{"replace neigh": 1, "add fdb": 1, "delete fdb": 1})
	check("removing a peer", moved[:200], "", map[string]int{"delete route": 1, "delete neigh": 1, "delete fdb": 1})
	check("nothing", moved[:200], "", map[string]int{})
}

// fakePeer i is a VXLAN peer that no test ever sends traffic to.
func fakePeer(i int) overlay.Node {
	return overlay.Node{
		Name:     fmt.Sprintf("peer%03d", i),
		IP:       net.IPv4(10, 60, byte(i/250), byte(i%250+1)).To4(),
		PodCIDRs: []*net.IPNet{{IP: net.IPv4(10, 128+byte(i/256), byte(i%256), 0).To4(), Mask: net.CIDRMask(24, 32)}},
	}
}

func fakePeers(n int) []overlay.Node {
	out := make([]overlay.Node, n)
	for i := range out {
		out[i] = fakePeer(i)
	}
	return out
}

// TestDefaultRouteUnderlay: with no underlay named, the default route's
// interface and its first address are used.
func TestDefaultRouteUnderlay(t *testing.T) {
	segs := newSegments(t, 2)
	nodes := []*labNode{addNode(t, segs, 0, 1), addNode(t, segs, 1, 2)}
	var recs []*overlay.Reconciler
	for _, n := range nodes {
		r, err := overlay.New(overlay.Config{Mode: overlay.ModeVXLAN, NetNS: n.ns.Path()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		recs = append(recs, r)
	}
	all := []overlay.Node{nodes[0].node(false), nodes[1].node(false)}
	for i, n := range nodes {
		self := overlay.Node{Name: n.name, PodCIDRs: all[i].PodCIDRs} // IP from the underlay
		rep, err := recs[i].Set(context.Background(), self, all)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Underlay != "eth0" || rep.MTU != 1450 {
			t.Errorf("underlay %q MTU %d, want eth0 and 1450", rep.Underlay, rep.MTU)
		}
	}
	if err := testenv.Ping(nodes[0].pod, nodes[1].pod6, 2); err != nil {
		t.Error(err)
	}
}

// TestSetPlansAgainAfterUnderlayMove: a Set with the same peers as the last
// one reuses that plan only while the underlay is the same. Here the node's
// own underlay address (no IP given: its first global address) moves onto
// one peer's: that peer is now this node, and its objects must go, though
// the peer list did not change.
func TestSetPlansAgainAfterUnderlayMove(t *testing.T) {
	s := newScaleNode(t)
	s.self.IP = nil
	peers := fakePeers(3)
	for i := range peers {
		peers[i].IP = net.IPv4(192, 168, 77, byte(20+i)).To4()
	}
	objects := func() int {
		d, err := s.r.Status(context.Background(), s.self, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(d.Changes) // with no peers, Status lists every object to delete
	}
	s.set(t, peers)
	if n := objects(); n != 9 {
		t.Fatalf("3 peers: %d objects, want 9 (route, neighbour, FDB each)", n)
	}
	testenv.MustIP(t, s.ns, "addr", "del", "192.168.77.11/24", "dev", "eth0")
	testenv.MustIP(t, s.ns, "addr", "add", "192.168.77.21/24", "dev", "eth0")
	rep, err := s.r.Set(context.Background(), s.self, peers)
	if err != nil {
		t.Fatal(err)
	}
	if n := objects(); n != 6 {
		t.Fatalf("after the underlay moved to peer %s's address: %d objects, want 6; the Set applied %v", peers[1].Name, n, rep.Applied)
	}
	// and a peer list that only looks the same (as long, one name twice)
	// is planned as it is
	twice := append(slices.Clone(peers[:2]), peers[0])
	if _, err := s.r.Set(context.Background(), s.self, twice); !errors.Is(err, overlay.ErrConflict) {
		t.Fatalf("peer %s listed twice: %v, want ErrConflict", peers[0].Name, err)
	}
	if n := objects(); n != 3 {
		t.Fatalf("peers %s, %s, %s: %d objects, want 3 (peer %s's; %s is this node)", twice[0].Name, twice[1].Name, twice[2].Name, n, peers[0].Name, peers[1].Name)
	}
}
