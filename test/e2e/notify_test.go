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

// TestAgentRepairsFromKernelNotifications: with the periodic pass an hour
// apart, every kind of drift a pass compares is put right within seconds,
// so only the kernel's notifications can have started the repair: a peer
// route deleted or changed by hand (IPv4 and IPv6), a permanent neighbour
// entry deleted or given another MAC, an FDB entry sent elsewhere, the
// VXLAN device set down (the kernel drops its routes without telling
// anyone about them, but it announces the link).
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
	for _, d := range []struct {
		what  string
		drift []string // an ip command; "bridge" first for bridge(8)
		back  func() (bool, string)
	}{
		{"peer route deleted", []string{"route", "del", "10.60.2.0/24", "dev", "village.7", "metric", metric}, route4},
		{"peer route changed", []string{"route", "change", "10.60.2.0/24", "via", "10.60.3.0", "dev", "village.7", "onlink", "proto", "86", "metric", metric}, route4},
		{"IPv6 peer route changed", []string{"-6", "route", "change", "fd60:0:0:2::/64", "via", "fd60:0:0:3::", "dev", "village.7", "onlink", "proto", "86", "metric", metric}, route6},
		{"neighbour entry deleted", []string{"neigh", "del", "10.60.2.0", "dev", "village.7"}, neigh},
		{"neighbour entry given another MAC", []string{"neigh", "replace", "10.60.2.0", "lladdr", "02:00:00:00:00:99", "dev", "village.7", "nud", "permanent"}, neigh},
		{"FDB entry sent elsewhere", []string{"bridge", "fdb", "replace", mac, "dev", "village.7", "dst", "192.168.78.99", "self", "permanent"}, fdb},
		{"VXLAN device set down", []string{"link", "set", "village.7", "down"}, route4},
	} {
		if d.drift[0] == "bridge" {
			bridge(d.drift[1:]...)
		} else {
			testenv.MustIP(t, n1.NS, d.drift...)
		}
		if ok, out := d.back(); ok {
			t.Fatalf("%s: the drift did not take:\n%s", d.what, out)
		}
		took := waitFor(t, 20*time.Second, d.what+": put right (period 1h: only a notification can do it)", d.back)
		t.Logf("FIGURE: %s: put right after %s through kernel notifications", d.what, took.Round(time.Millisecond))
	}
	for _, f := range []func() (bool, string){route4, route6, neigh, fdb} {
		if ok, out := f(); !ok {
			t.Fatalf("after the repairs node 2's objects are incomplete:\n%s", out)
		}
	}
	if !strings.Contains(log.String(), "kernel change") {
		t.Fatalf("the repairs were not passes started by a kernel change:\n%s", log.String())
	}
}
