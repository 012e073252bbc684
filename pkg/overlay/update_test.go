package overlay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// updPeer i: on the underlay's subnet (192.168.77.0/24) when onLAN, else
// routed elsewhere; one IPv4 and one IPv6 pod subnet.
func updPeer(i int, onLAN bool) overlay.Node {
	ip := net.IPv4(10, 60, 0, byte(i+1)).To4()
	if onLAN {
		ip = net.IPv4(192, 168, 77, byte(100+i)).To4()
	}
	return overlay.Node{
		Name: fmt.Sprintf("peer%02d", i),
		IP:   ip,
		PodCIDRs: []*net.IPNet{
			{IP: net.IPv4(10, 200, byte(i), 0).To4(), Mask: net.CIDRMask(24, 32)},
			{IP: net.ParseIP(fmt.Sprintf("fd55:%x::", i+1)), Mask: net.CIDRMask(64, 128)},
		},
	}
}

type updStep struct {
	what   string
	change overlay.PeerChange
}

// TestUpdateMatchesSet: after every Update of a sequence (peers added,
// moved, re-addressed, removed, a conflicting peer and its resolution, a
// backend switch in auto), Status with the full list finds nothing to
// change, and the state equals what Set makes from nothing.
func TestUpdateMatchesSet(t *testing.T) {
	for _, mode := range []overlay.Mode{overlay.ModeVXLAN, overlay.ModeHostGW, overlay.ModeAuto} {
		t.Run(string(mode), func(t *testing.T) {
			_, nodes := threeNodes(t)
			n := nodes[0]
			r := newReconciler(t, n.ns, overlay.Config{Mode: mode})
			ctx := context.Background()
			self := n.node(false)
			lan := mode != overlay.ModeVXLAN
			peer := func(i int) overlay.Node {
				p := updPeer(i, lan && (mode == overlay.ModeHostGW || i%2 == 0))
				if mode == overlay.ModeHostGW {
					p.PodCIDRs = p.PodCIDRs[:1] // IPv6 pods cannot go via an IPv4 underlay
				}
				return p
			}
			if _, err := r.Update(ctx, self, overlay.PeerChange{Added: []overlay.Node{peer(0)}}); !errors.Is(err, overlay.ErrNeedSet) {
				t.Fatalf("Update before any Set: %v, want ErrNeedSet", err)
			}
			current := map[string]overlay.Node{}
			var base []overlay.Node
			for i := range 6 {
				base = append(base, peer(i))
				current[peer(i).Name] = peer(i)
			}
			if _, err := r.Set(ctx, self, base); err != nil {
				t.Fatal(err)
			}

			moved := peer(3)
			moved.IP = net.IPv4(192, 168, 77, 203).To4()
			if mode == overlay.ModeVXLAN {
				moved.IP = net.IPv4(10, 61, 0, 3).To4()
			}
			switched := peer(4) // auto: on the LAN -> routed elsewhere (host-gw -> vxlan)
			if mode == overlay.ModeAuto {
				switched.IP = net.IPv4(10, 62, 0, 4).To4()
			} else {
				switched.VtepMAC = net.HardwareAddr{0x0e, 0x00, 0, 0, 0, 4}
			}
			readdressed := peer(1)
			readdressed.PodCIDRs = append([]*net.IPNet{{IP: net.IPv4(10, 201, 1, 0).To4(), Mask: net.CIDRMask(24, 32)}}, readdressed.PodCIDRs[1:]...)
			intruder := peer(9) // claims peer02's IPv4 pod subnet
			intruder.Name = "peer00a"
			intruder.PodCIDRs = []*net.IPNet{peer(2).PodCIDRs[0]}
			swapA, swapB := peer(0), peer(7) // exchange pod subnets in one change
			swapA.PodCIDRs, swapB.PodCIDRs = peer(7).PodCIDRs, peer(0).PodCIDRs
			steps := []updStep{
				{"add two", overlay.PeerChange{Added: []overlay.Node{peer(6), peer(7)}}},
				{"two peers swap pod subnets", overlay.PeerChange{Updated: []overlay.Node{swapA, swapB}}},
				{"and swap them back", overlay.PeerChange{Updated: []overlay.Node{peer(7), peer(0)}}},
				{"move one", overlay.PeerChange{Updated: []overlay.Node{moved}}},
				{"switch backend or MAC", overlay.PeerChange{Updated: []overlay.Node{switched}}},
				{"new pod subnet", overlay.PeerChange{Updated: []overlay.Node{readdressed}}},
				{"remove one", overlay.PeerChange{Removed: []overlay.Node{{Name: peer(5).Name}}}},
				{"conflicting peer", overlay.PeerChange{Added: []overlay.Node{intruder}}},
				{"conflict resolved by removal", overlay.PeerChange{Removed: []overlay.Node{peer(2)}}},
				{"add back and remove at once", overlay.PeerChange{Added: []overlay.Node{peer(5)}, Removed: []overlay.Node{peer(6)}}},
				{"unknown removal, known addition", overlay.PeerChange{Added: []overlay.Node{peer(7)}, Removed: []overlay.Node{{Name: "nobody"}}}},
			}
			for _, s := range steps {
				all := append(applyToNames(current, s.change), self)
				rep, err := r.Update(ctx, self, s.change)
				conflict := s.what == "conflicting peer"
				if conflict != (err != nil) || (conflict && !errors.Is(err, overlay.ErrConflict)) {
					t.Fatalf("%s: Update error %v (want a conflict: %v)", s.what, err, conflict)
				}
				for _, c := range rep.Applied {
					if c.Object.Kind == overlay.KindDevice || c.Object.Kind == overlay.KindAddress {
						t.Errorf("%s: Update touched %s", s.what, c)
					}
				}
				d, err := r.Status(ctx, self, all)
				if err != nil {
					t.Fatalf("%s: Status: %v", s.what, err)
				}
				if len(d.Changes) != 0 || len(d.Problems) != len(rep.Failed) {
					t.Fatalf("%s: after Update (applied %v, failed %v) Status finds\n%v", s.what, rep.Applied, rep.Failed, d)
				}
			}
			// The same peers through Set from nothing give the same kernel state.
			got := readState(t, n.ns, "village.1")
			var all []overlay.Node
			for _, p := range current {
				all = append(all, p)
			}
			if _, err := r.Teardown(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Set(ctx, self, all); err != nil {
				t.Fatal(err)
			}
			if want := readState(t, n.ns, "village.1"); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("after Updates:\n%v\nSet from nothing:\n%v", got, want)
			}
			if _, err := r.Update(ctx, n.node(true), overlay.PeerChange{}); !errors.Is(err, overlay.ErrNeedSet) {
				t.Errorf("Update with another self: %v, want ErrNeedSet", err)
			}
		})
	}
}

// TestUpdateLeavesForeignRoute: a route of another protocol where a new
// peer's route would go is a conflict, as in Set, and is not overwritten;
// the peer's other objects are written.
func TestUpdateLeavesForeignRoute(t *testing.T) {
	_, nodes := threeNodes(t)
	n := nodes[0]
	r := newReconciler(t, n.ns, overlay.Config{Mode: overlay.ModeVXLAN})
	ctx := context.Background()
	self := n.node(false)
	if _, err := r.Set(ctx, self, []overlay.Node{updPeer(0, false)}); err != nil {
		t.Fatal(err)
	}
	testenv.MustIP(t, n.ns, "route", "add", "10.200.1.0/24", "via", "192.168.77.12", "dev", "eth0", "proto", "static")
	rep, err := r.Update(ctx, self, overlay.PeerChange{Added: []overlay.Node{updPeer(1, false)}})
	if !errors.Is(err, overlay.ErrConflict) || !strings.Contains(err.Error(), "10.200.1.0/24") {
		t.Fatalf("Update over a foreign route: %v", err)
	}
	if out := testenv.MustIP(t, n.ns, "route", "show", "10.200.1.0/24"); !strings.Contains(out, "proto static") {
		t.Errorf("foreign route overwritten: %s", out)
	}
	if len(rep.Applied) != 4 { // IPv6 route, two neighbours, FDB entry
		t.Errorf("applied %v", rep.Applied)
	}
	// The baseline is gone: the caller must Set, which reports the same conflict.
	if _, err := r.Update(ctx, self, overlay.PeerChange{}); !errors.Is(err, overlay.ErrNeedSet) {
		t.Errorf("Update after a failed one: %v, want ErrNeedSet", err)
	}
	if _, err := r.Set(ctx, self, []overlay.Node{updPeer(0, false), updPeer(1, false)}); !errors.Is(err, overlay.ErrConflict) {
		t.Errorf("Set: %v, want the conflict", err)
	}
}

// TestUpdateWritesWhatSetWrites: Set and Update share one engine, so a
// change applied by Update (against the last plan) makes the same writes,
// in the same order, as Set making the same peer set over the same kernel
// state (against a dump), and leaves the same state.
func TestUpdateWritesWhatSetWrites(t *testing.T) {
	_, nodes := threeNodes(t)
	n := nodes[0]
	ctx := context.Background()
	self := n.node(false)
	withMAC := func(p overlay.Node, b byte) overlay.Node {
		p.VtepMAC = net.HardwareAddr{0x0e, 0, 0, 0, 0, b}
		return p
	}
	base := []overlay.Node{withMAC(updPeer(0, false), 1), updPeer(1, false), updPeer(2, true)}
	moved := withMAC(updPeer(0, false), 1) // same VTEP MAC, another underlay address
	moved.IP = net.IPv4(10, 61, 0, 1).To4()
	readdressed := updPeer(1, false)
	readdressed.PodCIDRs = readdressed.PodCIDRs[:1]
	for _, mode := range []overlay.Mode{overlay.ModeVXLAN, overlay.ModeAuto} {
		r := newReconciler(t, n.ns, overlay.Config{Mode: mode})
		for _, tc := range []struct {
			what   string
			change overlay.PeerChange
		}{
			{"FDB destination moved", overlay.PeerChange{Updated: []overlay.Node{moved}}},
			{"peer removed", overlay.PeerChange{Removed: []overlay.Node{{Name: "peer02"}}}},
			{"peer added", overlay.PeerChange{Added: []overlay.Node{updPeer(3, false), updPeer(4, true)}}},
			{"pod subnet dropped", overlay.PeerChange{Updated: []overlay.Node{readdressed}}},
		} {
			byName := map[string]overlay.Node{}
			for _, p := range base {
				byName[p.Name] = p
			}
			after := applyToNames(byName, tc.change)
			if _, err := r.Set(ctx, self, base); err != nil {
				t.Fatal(err)
			}
			viaSet, err := r.Set(ctx, self, after)
			if err != nil {
				t.Fatalf("%s %s: Set: %v", mode, tc.what, err)
			}
			setState := readState(t, n.ns, "village.1")
			if _, err := r.Set(ctx, self, base); err != nil {
				t.Fatal(err)
			}
			viaUpdate, err := r.Update(ctx, self, tc.change)
			if err != nil {
				t.Fatalf("%s %s: Update: %v", mode, tc.what, err)
			}
			if len(viaSet.Applied) == 0 || fmt.Sprint(viaUpdate.Applied) != fmt.Sprint(viaSet.Applied) {
				t.Errorf("%s %s: Update applied\n%v\nSet applied\n%v", mode, tc.what, viaUpdate.Applied, viaSet.Applied)
			}
			if got := readState(t, n.ns, "village.1"); fmt.Sprint(got) != fmt.Sprint(setState) {
				t.Errorf("%s %s: state after Update\n%v\nafter Set\n%v", mode, tc.what, got, setState)
			}
		}
	}
}

// applyToNames applies c to the peers by name and returns them all.
func applyToNames(byName map[string]overlay.Node, c overlay.PeerChange) []overlay.Node {
	for _, p := range c.Removed {
		delete(byName, p.Name)
	}
	for _, p := range append(c.Added, c.Updated...) {
		byName[p.Name] = p
	}
	all := make([]overlay.Node, 0, len(byName))
	for _, p := range byName {
		all = append(all, p)
	}
	return all
}
