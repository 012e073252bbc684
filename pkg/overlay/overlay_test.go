package overlay_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

func threeNodes(t *testing.T) ([]segment, []*labNode) {
	segs := newSegments(t, 1)
	return segs, []*labNode{addNode(t, segs, 0, 1), addNode(t, segs, 0, 2), addNode(t, segs, 0, 3)}
}

func countMatching(lines []string, sub string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// TestVXLAN: pods on three nodes reach each other over IPv4 and IPv6 through
// the VXLAN device, and the LAN only sees UDP to the configured port.
func TestVXLAN(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "underlay4", true: "underlay6"}[v6], func(t *testing.T) {
			segs, nodes := threeNodes(t)
			c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeVXLAN, VNI: 7, Port: 4790}, v6)
			reps := c.setAll(t)
			want := 1450
			if v6 {
				want = 1430
			}
			if reps[0].MTU != want || reps[0].Device != "village.7" || reps[0].Underlay != "eth0" {
				t.Errorf("report = MTU %d device %q underlay %q, want %d village.7 eth0", reps[0].MTU, reps[0].Device, reps[0].Underlay, want)
			}
			vx := startCapture(t, segs[0].ns, "udp dst port 4790")
			plain := startCapture(t, segs[0].ns, "icmp or icmp6 and not udp")
			c.pingAll(t)
			if n := len(vx.stop()); n < 12 {
				t.Errorf("saw %d VXLAN packets to port 4790 on the LAN, want at least 12", n)
			}
			if lines := plain.stop(); countMatching(lines, "10.244.")+countMatching(lines, "fd44:") > 0 {
				t.Errorf("pod traffic crossed the LAN unencapsulated:\n%s", strings.Join(lines, "\n"))
			}
			dev := testenv.MustIP(t, nodes[0].ns, "-d", "addr", "show", "village.7")
			local := map[bool]string{false: "local 192.168.77.11", true: "local fd77::11"}[v6]
			for _, w := range []string{"vxlan id 7", local, "dev eth0", "dstport 4790", "nolearning", "mtu " + fmt.Sprint(want),
				"link/ether " + overlay.DeriveMAC(nodes[0].node(v6).IP).String(), "inet 10.244.1.0/32", "inet6 fd44:1::/128"} {
				if !strings.Contains(dev, w) {
					t.Errorf("village.7 lacks %q:\n%s", w, dev)
				}
			}
			st := readState(t, nodes[0].ns, "village.7")
			if len(st.Routes) != 4 || len(st.Neighs) != 4 || len(st.FDB) != 2 {
				t.Errorf("node1 state = %+v, want 4 routes, 4 neighbours, 2 FDB entries", st)
			}
		})
	}
}

// TestVXLANFullSizeDF: a full-size don't-fragment ping crosses with the
// derived MTU, one byte more does not.
func TestVXLANFullSizeDF(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "underlay4", true: "underlay6"}[v6], func(t *testing.T) {
			_, nodes := threeNodes(t)
			nodes = nodes[:2]
			c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeVXLAN}, v6)
			mtu := c.setAll(t)[0].MTU
			for _, n := range nodes {
				n.setPodMTU(t, mtu)
			}
			for _, tc := range []struct {
				dst    string
				header int
			}{{nodes[1].pod4, 28}, {nodes[1].pod6, 48}} {
				if err := dfPing(nodes[0], tc.dst, mtu-tc.header); err != nil {
					t.Errorf("full-size DF ping with MTU %d: %v", mtu, err)
				}
				if err := dfPing(nodes[0], tc.dst, mtu-tc.header+1); err == nil {
					t.Errorf("DF ping one byte over MTU %d to %s crossed", mtu, tc.dst)
				}
			}
		})
	}
}

func dfPing(from *labNode, dst string, size int) error {
	args := []string{"netns", "exec", nsName(from.pod), "ping", "-M", "do", "-s", fmt.Sprint(size), "-c", "2", "-W", "2", "-i", "0.2"}
	if strings.Contains(dst, ":") {
		args = append(args, "-6")
	}
	out, err := exec.Command("ip", append(args, dst)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping -s %d %s: %w: %s", size, dst, err, out)
	}
	return nil
}

// TestHostGW: pods reach each other with plain routes via the peers'
// underlay addresses (IPv4 pods over an IPv4 underlay, IPv6 over IPv6), and
// nothing is encapsulated.
func TestHostGW(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[v6], func(t *testing.T) {
			segs, nodes := threeNodes(t)
			c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeHostGW}, v6)
			all := c.all()
			for i := range all { // one family: pod subnets of the underlay's family
				all[i].PodCIDRs = all[i].PodCIDRs[map[bool]int{false: 0, true: 1}[v6]:][:1]
			}
			for i, n := range nodes {
				rep, err := c.recs[i].Set(context.Background(), all[i], all)
				if err != nil {
					t.Fatalf("Set on %s: %v", n.name, err)
				}
				if rep.Device != "" || rep.MTU != 1500 {
					t.Errorf("host-gw report: device %q MTU %d, want none and 1500", rep.Device, rep.MTU)
				}
			}
			vx := startCapture(t, segs[0].ns, "udp")
			plain := startCapture(t, segs[0].ns, "icmp or icmp6")
			for _, a := range nodes {
				for _, b := range nodes {
					if a == b {
						continue
					}
					dst := map[bool]string{false: b.pod4, true: b.pod6}[v6]
					if err := testenv.Ping(a.pod, dst, 2); err != nil {
						t.Errorf("%s -> %s: %v", a.name, b.name, err)
					}
				}
			}
			if lines := vx.stop(); len(lines) > 0 {
				t.Errorf("host-gw sent UDP on the LAN:\n%s", strings.Join(lines, "\n"))
			}
			if n := countMatching(plain.stop(), map[bool]string{false: "10.244.", true: "fd44:"}[v6]); n < 12 {
				t.Errorf("saw %d plain pod packets on the LAN, want at least 12", n)
			}
			st := readState(t, nodes[0].ns, "village.1")
			want := map[bool][]string{
				false: {"10.244.2.0/24 via 192.168.77.12 dev eth0", "10.244.3.0/24 via 192.168.77.13 dev eth0"},
				true:  {"fd44:2::/64 via fd77::12 dev eth0", "fd44:3::/64 via fd77::13 dev eth0"},
			}[v6]
			if strings.Join(st.Routes, "|") != strings.Join(want, "|") {
				t.Errorf("routes = %q, want %q", st.Routes, want)
			}
			if out := testenv.MustIP(t, nodes[0].ns, "link", "show"); strings.Contains(out, "village.") {
				t.Errorf("host-gw made a VXLAN device:\n%s", out)
			}
		})
	}
}

// TestHostGWOffSubnetPeer: a peer behind a router cannot be host-gw; the
// error names it, and the reachable peer is still routed.
func TestHostGWOffSubnetPeer(t *testing.T) {
	segs := newSegments(t, 2)
	nodes := []*labNode{addNode(t, segs, 0, 1), addNode(t, segs, 0, 2), addNode(t, segs, 1, 3)}
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeHostGW}, false)
	all := c.all()
	for i := range all {
		all[i].PodCIDRs = all[i].PodCIDRs[:1]
	}
	rep, err := c.recs[0].Set(context.Background(), all[0], all)
	if err == nil {
		t.Fatal("Set with an off-subnet host-gw peer succeeded")
	}
	if !errors.Is(err, overlay.ErrOffSubnet) || !strings.Contains(err.Error(), "node3") {
		t.Errorf("error %q: want ErrOffSubnet naming node3", err)
	}
	if len(rep.Failed) != 1 || rep.Failed[0].Change.Object.Peer != "node3" {
		t.Errorf("report failures = %+v, want one for node3", rep.Failed)
	}
	if len(rep.Applied) != 1 || rep.Applied[0].Object.Peer != "node2" {
		t.Errorf("report applied = %+v, want node2's route", rep.Applied)
	}
	d, err := c.recs[0].Status(context.Background(), all[0], all)
	if err != nil || len(d.Changes) != 0 || len(d.Problems) != 1 {
		t.Errorf("Status = %+v, %v: want no changes and node3's problem", d, err)
	}
}

// TestAutoTwoSegments: auto uses host-gw for the peer on the same segment
// and VXLAN for the peer behind the router, and all pods reach each other.
func TestAutoTwoSegments(t *testing.T) {
	segs := newSegments(t, 2)
	nodes := []*labNode{addNode(t, segs, 0, 1), addNode(t, segs, 0, 2), addNode(t, segs, 1, 3)}
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeAuto}, false)
	c.setAll(t)
	st := readState(t, nodes[0].ns, "village.1")
	want := []string{
		"10.244.2.0/24 via 192.168.77.12 dev eth0",
		"10.244.3.0/24 via 10.244.3.0 dev village.1 onlink",
		"fd44:2::/64 via fd44:2:: dev village.1 onlink", // IPv6 pods over an IPv4 underlay: VXLAN
		"fd44:3::/64 via fd44:3:: dev village.1 onlink",
	}
	if strings.Join(st.Routes, "|") != strings.Join(want, "|") {
		t.Errorf("node1 routes = %q\nwant %q", st.Routes, want)
	}
	vx := startCapture(t, segs[0].ns, "udp dst port 4789")
	plain := startCapture(t, segs[0].ns, "icmp")
	for _, dst := range []string{nodes[1].pod4, nodes[2].pod4} {
		if err := testenv.Ping(nodes[0].pod, dst, 3); err != nil {
			t.Error(err)
		}
	}
	vxLines, plainLines := vx.stop(), plain.stop()
	if n := countMatching(plainLines, "10.244.2.2"); n < 6 {
		t.Errorf("same-segment pod traffic: %d plain ICMP packets on the LAN, want at least 6", n)
	}
	if n := countMatching(plainLines, "10.244.3.2"); n > 0 {
		t.Errorf("other-segment pod traffic crossed unencapsulated")
	}
	if n := countMatching(vxLines, "192.168.78.13"); n < 3 {
		t.Errorf("other-segment pod traffic: %d VXLAN packets to node3 on the LAN, want at least 3", n)
	}
	c.pingAll(t)
}
