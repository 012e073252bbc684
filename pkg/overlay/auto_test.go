package overlay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// oneFamily is n's overlay node with only the pod subnet of the underlay's
// family, so auto can route every peer with host-gw.
func oneFamily(n *labNode, v6 bool) overlay.Node {
	o := n.node(v6)
	if v6 {
		o.PodCIDRs = o.PodCIDRs[1:]
	} else {
		o.PodCIDRs = o.PodCIDRs[:1]
	}
	return o
}

func hasLink(t *testing.T, n *labNode, name string) bool {
	t.Helper()
	_, err := testenv.IP(n.ns, "link", "show", "dev", name)
	return err == nil
}

// TestAutoOnLinkOnly: auto with every peer on the underlay's subnet makes no
// VXLAN device and reports the underlay's MTU (Set and PodMTU alike);
// full-size don't-fragment packets of that MTU cross plain on the LAN. A
// third node behind a router then joins: the device appears with the VXLAN
// MTU, that peer goes over it and the on-link one stays host-gw. A pod
// that kept the underlay MTU learns the smaller path MTU from the node's
// ICMP. When the off-link node leaves, the device goes again. Update never
// makes or removes the device: it asks for a Set.
func TestAutoOnLinkOnly(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			testAutoOnLinkOnly(t, v6)
		})
	}
}

func testAutoOnLinkOnly(t *testing.T, v6 bool) {
	ctx := context.Background()
	segs := newSegments(t, 2)
	nodes := []*labNode{addNode(t, segs, 0, 1), addNode(t, segs, 0, 2), addNode(t, segs, 1, 3)}
	recs := make([]*overlay.Reconciler, len(nodes))
	for i, n := range nodes {
		recs[i] = newReconciler(t, n.ns, overlay.Config{Mode: overlay.ModeAuto})
	}
	pod := func(n *labNode) string { return map[bool]string{false: n.pod4, true: n.pod6}[v6] }
	header := map[bool]int{false: 28, true: 48}[v6] // IP + ICMP headers of a ping
	overhead := map[bool]int{false: 50, true: 70}[v6]
	set := func(i int, members ...int) overlay.Report {
		t.Helper()
		var peers []overlay.Node
		for _, m := range members {
			peers = append(peers, oneFamily(nodes[m], v6))
		}
		rep, err := recs[i].Set(ctx, oneFamily(nodes[i], v6), peers)
		if err != nil {
			t.Fatalf("Set on %s: %v", nodes[i].name, err)
		}
		return rep
	}
	podMTU := func(i int) int {
		t.Helper()
		mtu, err := recs[i].PodMTU(oneFamily(nodes[i], v6))
		if err != nil {
			t.Fatalf("PodMTU on %s: %v", nodes[i].name, err)
		}
		return mtu
	}

	// Two nodes on one LAN.
	for i := range 2 {
		rep := set(i, 0, 1)
		if rep.Device != "" || rep.MTU != 1500 {
			t.Errorf("%s: report device %q MTU %d, want none and 1500", nodes[i].name, rep.Device, rep.MTU)
		}
		if got := podMTU(i); got != 1500 {
			t.Errorf("%s: PodMTU %d, want the underlay's 1500", nodes[i].name, got)
		}
		if hasLink(t, nodes[i], "village.1") {
			t.Errorf("%s: auto with on-link peers only made village.1", nodes[i].name)
		}
		nodes[i].setPodMTU(t, 1500)
	}
	st := readState(t, nodes[0].ns, "village.1")
	want := map[bool]string{false: "10.244.2.0/24 via 192.168.77.12 dev eth0", true: "fd44:2::/64 via fd77::12 dev eth0"}[v6]
	if strings.Join(st.Routes, "|") != want {
		t.Errorf("node1 routes %q, want %q", st.Routes, want)
	}
	vx := startCapture(t, segs[0].ns, "udp")
	plain := startCapture(t, segs[0].ns, map[bool]string{false: "icmp", true: "icmp6"}[v6])
	if err := dfPing(nodes[0], pod(nodes[1]), 1500-header); err != nil {
		t.Errorf("full-size DF ping at the underlay MTU: %v", err)
	}
	if lines := vx.stop(); len(lines) > 0 {
		t.Errorf("auto on one LAN sent UDP:\n%s", strings.Join(lines, "\n"))
	}
	if n := countMatching(plain.stop(), fmt.Sprintf("length %d", 1500-header+8)); n < 2 {
		t.Errorf("saw %d full-size plain pod packets on the LAN, want at least 2", n)
	}

	// Update cannot make the device: the first off-link peer needs a Set.
	if _, err := recs[0].Update(ctx, oneFamily(nodes[0], v6), overlay.PeerChange{Added: []overlay.Node{oneFamily(nodes[2], v6)}}); !errors.Is(err, overlay.ErrNeedSet) {
		t.Errorf("Update adding an off-link peer: %v, want ErrNeedSet", err)
	}
	if hasLink(t, nodes[0], "village.1") {
		t.Error("Update made village.1")
	}

	// node3 joins from the other segment.
	for i := range 3 {
		rep := set(i, 0, 1, 2)
		wantDev, wantMTU := "village.1", 1500-overhead
		if rep.Device != wantDev || rep.MTU != wantMTU {
			t.Errorf("%s with an off-link peer: report device %q MTU %d, want %s %d", nodes[i].name, rep.Device, rep.MTU, wantDev, wantMTU)
		}
		if got := podMTU(i); got != wantMTU {
			t.Errorf("%s with an off-link peer: PodMTU %d, want %d", nodes[i].name, got, wantMTU)
		}
		if !hasLink(t, nodes[i], "village.1") {
			t.Errorf("%s with an off-link peer: no village.1", nodes[i].name)
		}
	}
	nodes[2].setPodMTU(t, 1500-overhead)
	st = readState(t, nodes[0].ns, "village.1")
	want = map[bool]string{
		false: "10.244.2.0/24 via 192.168.77.12 dev eth0|10.244.3.0/24 via 10.244.3.0 dev village.1 onlink",
		true:  "fd44:2::/64 via fd77::12 dev eth0|fd44:3::/64 via fd44:3:: dev village.1 onlink",
	}[v6]
	if strings.Join(st.Routes, "|") != want {
		t.Errorf("node1 routes with node3 %q, want %q", st.Routes, want)
	}
	vx = startCapture(t, segs[0].ns, "udp dst port 4789")
	for _, n := range nodes[1:] {
		if err := testenv.Ping(nodes[0].pod, pod(n), 3); err != nil {
			t.Error(err)
		}
	}
	if n := countMatching(vx.stop(), map[bool]string{false: "192.168.78.13", true: "fd78::13"}[v6]); n < 3 {
		t.Errorf("saw %d VXLAN packets to node3 on the LAN, want at least 3", n)
	}
	// node1's pod kept 1500: its first full-size DF packet to node3 is
	// refused by its node with the device's MTU, which the pod then uses.
	_ = dfPing(nodes[0], pod(nodes[2]), 1500-header)
	route := testenv.MustIP(t, nodes[0].pod, "route", "get", pod(nodes[2]))
	if !strings.Contains(route, fmt.Sprintf("mtu %d", 1500-overhead)) {
		t.Errorf("node1's pod did not learn path MTU %d to node3's pod: %s", 1500-overhead, route)
	}
	if err := dfPing(nodes[0], pod(nodes[2]), 1500-overhead-header); err != nil {
		t.Errorf("DF ping at the learned path MTU: %v", err)
	}

	// Update cannot remove the device either; Set does once node3 left.
	if _, err := recs[0].Update(ctx, oneFamily(nodes[0], v6), overlay.PeerChange{Removed: []overlay.Node{{Name: "node3"}}}); !errors.Is(err, overlay.ErrNeedSet) {
		t.Errorf("Update removing the last off-link peer: %v, want ErrNeedSet", err)
	}
	rep := set(0, 0, 1)
	if rep.Device != "" || rep.MTU != 1500 || hasLink(t, nodes[0], "village.1") || podMTU(0) != 1500 {
		t.Errorf("after node3 left: report device %q MTU %d, PodMTU %d, village.1 present %v; want none, 1500, 1500, false",
			rep.Device, rep.MTU, podMTU(0), hasLink(t, nodes[0], "village.1"))
	}
	if d, err := recs[0].Status(ctx, oneFamily(nodes[0], v6), []overlay.Node{oneFamily(nodes[1], v6)}); err != nil || !d.Clean() {
		t.Errorf("Status after the device went: %+v, %v", d, err)
	}
	if err := testenv.Ping(nodes[0].pod, pod(nodes[1]), 2); err != nil {
		t.Error(err)
	}
}
