package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// TestAgentRepairsFromKernelNotifications: with the periodic pass an hour
// apart, villaged's repairs of a deleted peer route and of a deleted
// permanent neighbour entry come back within seconds: only the kernel's
// notifications can make that happen.
func TestAgentRepairsFromKernelNotifications(t *testing.T) {
	nodes := staticCluster(t)
	n1 := nodes[0]
	conf := filepath.Join(n1.Dir, "ovl.conflist")
	must(t, os.WriteFile(conf, n1.list(t, "vxlan", nodes, "").Bytes, 0o644), "conflist")
	log, _ := runVillaged(t, n1.Node, conf, "node-"+n1.ip, "1h")
	metric := fmt.Sprint(overlay.Metric("ovl"))
	route := func() (bool, string) {
		r := testenv.MustIP(t, n1.NS, "route", "show", "10.60.2.0/24")
		return strings.Contains(r, "dev village.7") && strings.Contains(r, "metric "+metric), r
	}
	neigh := func() (bool, string) {
		r := testenv.MustIP(t, n1.NS, "neigh", "show", "10.60.2.0", "dev", "village.7")
		return strings.Contains(r, "PERMANENT"), r
	}
	waitFor(t, 20*time.Second, "the start pass makes the peer route", route)
	if ok, r := neigh(); !ok {
		t.Fatalf("no neighbour entry for node 2's VTEP: %s", r)
	}
	testenv.MustIP(t, n1.NS, "route", "del", "10.60.2.0/24", "dev", "village.7", "metric", metric)
	if ok, _ := route(); ok {
		t.Fatal("the route is still there after deleting it")
	}
	d := waitFor(t, 20*time.Second, "the deleted route is back (period 1h: only a notification can do it)", route)
	t.Logf("FIGURE: deleted peer route restored after %s through kernel notifications", d.Round(time.Millisecond))
	testenv.MustIP(t, n1.NS, "neigh", "del", "10.60.2.0", "dev", "village.7")
	waitFor(t, 20*time.Second, "the deleted neighbour entry is back", neigh)
	if !strings.Contains(log.String(), "kernel change") {
		t.Fatalf("the repairs were not passes started by a kernel change:\n%s", log.String())
	}
}
