package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// TestAgentRepairsFromKernelNotifications: with the tick and the safety
// net an hour apart, every kind of drift a pass compares is put right
// within seconds, so only the kernel's notifications can have started the
// repair: a peer route deleted or changed by hand (IPv4 and IPv6), a stray
// route of the network, a permanent neighbour entry deleted or given
// another MAC, an FDB entry sent elsewhere or deleted (each repaired as
// that one object, not by a full pass), the VXLAN device set down (the
// kernel drops its routes without telling anyone about them, but it
// announces the link) or deleted (both the device made right first, on
// its own, then a full pass for the rest). Each case waits for
// the agent to log its repair of the object and for the object to be
// back: the repair can come before the test could look at the drift.
func TestAgentRepairsFromKernelNotifications(t *testing.T) {
	nodes := staticCluster(t)
	n1 := nodes[0]
	conf := filepath.Join(n1.Dir, "ovl.conflist")
	must(t, os.WriteFile(conf, n1.list(t, "vxlan", nodes, "").Bytes, 0o644), "conflist")
	log, _ := runVillaged(t, n1.Node, conf, "node-"+n1.ip, "1h")
	metric := fmt.Sprint(overlay.Metric("ovl"))
	mac := overlay.DeriveMAC(net.ParseIP("192.168.78.12").To4()).String()
	show := func(args ...string) func() (bool, string) {
		want := args[len(args)-1]
		return func() (bool, string) {
			out := testenv.MustIP(t, n1.NS, args[:len(args)-1]...)
			return strings.Contains(out, want), out
		}
	}
	route4 := show("route", "show", "10.60.2.0/24", "via 10.60.2.0 dev village.7 proto 86 metric "+metric+" onlink")
	route6 := show("-6", "route", "show", "fd60:0:0:2::/64", "via fd60:0:0:2:: dev village.7 proto 86 metric "+metric+" onlink")
	neigh := show("neigh", "show", "10.60.2.0", "dev", "village.7", "lladdr "+mac+" PERMANENT")
	bridge := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"netns", "exec", n1.Name(), "bridge"}, args...)...).CombinedOutput()
		must(t, err, "bridge %s: %s", strings.Join(args, " "), out)
		return string(out)
	}
	fdb := func() (bool, string) {
		out := bridge("fdb", "show", "dev", "village.7")
		return strings.Contains(out, mac+" dst 192.168.78.12 self permanent"), out
	}
	waitFor(t, 20*time.Second, "the start pass makes the peer route", route4)
	for _, f := range []func() (bool, string){route6, neigh, fdb} {
		if ok, out := f(); !ok {
			t.Fatalf("the start pass left node 2's objects incomplete:\n%s", out)
		}
	}
	noStray := func() (bool, string) {
		out := testenv.MustIP(t, n1.NS, "route", "show", "10.60.9.0/24")
		return strings.TrimSpace(out) == "", out
	}
	const object, device = "kernel change: ", "kernel change (the VXLAN device first): "
	for _, d := range []struct {
		what   string
		drift  []string // an ip command; "bridge" first for bridge(8)
		logged string   // the agent's line for the repair
		back   func() (bool, string)
	}{
		{"peer route deleted", []string{"route", "del", "10.60.2.0/24", "dev", "village.7", "metric", metric}, object + "add route 10.60.2.0/24", route4},
		{"peer route changed", []string{"route", "change", "10.60.2.0/24", "via", "10.60.3.0", "dev", "village.7", "onlink", "proto", "86", "metric", metric}, object + "replace route 10.60.2.0/24", route4},
		{"IPv6 peer route changed", []string{"-6", "route", "change", "fd60:0:0:2::/64", "via", "fd60:0:0:3::", "dev", "village.7", "onlink", "proto", "86", "metric", metric}, object + "replace route fd60:0:0:2::/64", route6},
		{"stray route of the network", []string{"route", "add", "10.60.9.0/24", "via", "10.60.2.0", "dev", "village.7", "onlink", "proto", "86", "metric", metric}, object + "delete route 10.60.9.0/24", noStray},
		{"neighbour entry deleted", []string{"neigh", "del", "10.60.2.0", "dev", "village.7"}, object + "add neigh 10.60.2.0", neigh},
		{"neighbour entry given another MAC", []string{"neigh", "replace", "10.60.2.0", "lladdr", "02:00:00:00:00:99", "dev", "village.7", "nud", "permanent"}, object + "replace neigh 10.60.2.0", neigh},
		{"FDB entry sent elsewhere", []string{"bridge", "fdb", "replace", mac, "dev", "village.7", "dst", "192.168.78.99", "self", "permanent"}, object + "replace fdb " + mac, fdb},
		{"FDB entry deleted", []string{"bridge", "fdb", "del", mac, "dev", "village.7", "dst", "192.168.78.12", "self"}, object + "add fdb " + mac, fdb},
		{"VXLAN device set down", []string{"link", "set", "village.7", "down"}, device + "replace device village.7 up", route4},
		{"VXLAN device deleted", []string{"link", "del", "village.7"}, device + "add device village.7", route4},
	} {
		from := len(log.String())
		if d.drift[0] == "bridge" {
			bridge(d.drift[1:]...)
		} else {
			testenv.MustIP(t, n1.NS, d.drift...)
		}
		took := waitFor(t, 20*time.Second, d.what+": put right (tick and safety net 1h: only a notification can do it)", func() (bool, string) {
			since := log.String()[from:]
			if !strings.Contains(since, d.logged) {
				return false, "no " + d.logged + " in the log since the drift:\n" + since
			}
			return d.back()
		})
		t.Logf("FIGURE: %s: put right after %s through kernel notifications", d.what, took.Round(time.Millisecond))
	}
	for _, f := range []func() (bool, string){route4, route6, neigh, fdb} {
		if ok, out := f(); !ok {
			t.Fatalf("after the repairs node 2's objects are incomplete:\n%s", out)
		}
	}
}

// TestAgentRepairsAFlood: 1,000 peer routes flushed at once (the
// notifications of one flush arrive together) all come back, with the
// tick and the safety net an hour apart.
func TestAgentRepairsAFlood(t *testing.T) {
	nodes := staticCluster(t)
	n1 := nodes[0]
	const count = 1000
	peers := []*clusterNode{n1}
	for i := range count {
		peers = append(peers, &clusterNode{ip: fmt.Sprintf("172.20.%d.%d", i/250, 1+i%250),
			subnet: fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250), subnet6: fmt.Sprintf("fd61:0:%x::/64", i)})
	}
	conf := filepath.Join(n1.Dir, "ovl.conflist")
	must(t, os.WriteFile(conf, n1.list(t, "vxlan", peers, "").Bytes, 0o644), "conflist")
	log, _ := runVillaged(t, n1.Node, conf, "node-"+n1.ip, "1h")
	routes := func() (bool, string) {
		out, err := testenv.IP(n1.NS, "route", "show", "proto", "86", "dev", "village.7")
		if err != nil {
			return false, err.Error() // no device yet
		}
		n := strings.Count(out, "\n")
		return n == count, fmt.Sprintf("%d IPv4 peer routes, want %d", n, count)
	}
	waitFor(t, 60*time.Second, "the start pass makes every peer route", routes)
	from := len(log.String())
	testenv.MustIP(t, n1.NS, "route", "flush", "proto", "86", "dev", "village.7")
	took := waitFor(t, 60*time.Second, "every flushed route back (tick and safety net 1h)", func() (bool, string) {
		since := log.String()[from:]
		if !strings.Contains(since, "kernel change") {
			return false, "no repair in the log since the flush:\n" + since
		}
		return routes()
	})
	since := log.String()[from:]
	t.Logf("FIGURE: %d IPv4 peer routes flushed at once: all back after %s through kernel notifications (%d repaired as single objects, full passes: %d)",
		count, took.Round(time.Millisecond), strings.Count(since, "kernel change: add route"), strings.Count(since, "kernel change (full pass): add route"))
}
