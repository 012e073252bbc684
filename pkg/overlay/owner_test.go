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

// TestUpgradeTakesOverOldObjects: objects Village made before they carried
// the network's identity (routes with the kernel's default metric, a VXLAN
// device without an alias) are taken over by the first vxlan network that
// wants them (replaced by its own, device aliased in place); an old route to
// a destination this network does not want stays (it may be another
// network's), and a host-gw network never removes an alias-less device.
func TestUpgradeTakesOverOldObjects(t *testing.T) {
	_, nodes := threeNodes(t)
	n := nodes[0]
	ctx := context.Background()
	testenv.MustIP(t, n.ns, "link", "add", "village.1", "type", "vxlan", "id", "1", "dstport", "4789",
		"local", n.ip4.String(), "dev", "eth0", "nolearning")
	testenv.MustIP(t, n.ns, "link", "set", "village.1", "up")
	testenv.MustIP(t, n.ns, "route", "add", "10.244.2.0/24", "via", "192.168.77.12", "dev", "eth0", "proto", "86")
	testenv.MustIP(t, n.ns, "-6", "route", "add", "fd44:2::/64", "via", "fd44:2::", "dev", "village.1", "onlink", "proto", "86")
	testenv.MustIP(t, n.ns, "route", "add", "10.99.0.0/24", "via", "192.168.77.13", "dev", "eth0", "proto", "86")
	index := func() string {
		return strings.Fields(testenv.MustIP(t, n.ns, "-o", "link", "show", "village.1"))[0]
	}
	old := index()

	gw := newReconciler(t, n.ns, overlay.Config{Mode: overlay.ModeHostGW, Network: "b"})
	if _, err := gw.Set(ctx, n.node(false), nil); err != nil {
		t.Fatal(err)
	}
	if index() != old {
		t.Fatal("a host-gw network removed an alias-less VXLAN device")
	}

	r := newReconciler(t, n.ns, overlay.Config{Mode: overlay.ModeVXLAN, Network: "a"})
	peers := []overlay.Node{nodes[1].node(false), nodes[2].node(false)}
	if _, err := r.Set(ctx, n.node(false), peers); err != nil {
		t.Fatal(err)
	}
	metric := fmt.Sprint(overlay.Metric("a"))
	for _, fam := range []string{"-4", "-6"} {
		out := testenv.MustIP(t, n.ns, fam, "route", "show", "proto", "86")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			switch {
			case strings.HasPrefix(line, "10.99.0.0/24"):
				if strings.Contains(line, "metric") {
					t.Errorf("the route no network of this node wants changed: %s", line)
				}
			case !strings.Contains(line, "metric "+metric) || !strings.Contains(line, "dev village.1"):
				t.Errorf("old route left in front of the new one: %s\n%s", line, out)
			}
		}
		if !strings.Contains(out, "metric "+metric) {
			t.Errorf("no route of network a:\n%s", out)
		}
	}
	if !strings.Contains(testenv.MustIP(t, n.ns, "route", "show"), "10.99.0.0/24") {
		t.Error("the old route to 10.99.0.0/24 is gone")
	}
	link := testenv.MustIP(t, n.ns, "link", "show", "village.1")
	if index() != old || !strings.Contains(link, "alias village network a") {
		t.Errorf("device not taken over in place (index %s, was %s): %s", index(), old, link)
	}

	// Now it is a's: another vxlan network on VNI 1 is refused, and does not touch it.
	c := newReconciler(t, n.ns, overlay.Config{Mode: overlay.ModeVXLAN, Network: "c"})
	if _, err := c.Set(ctx, n.node(false), peers); !errors.Is(err, overlay.ErrConflict) || !strings.Contains(err.Error(), "village network a") {
		t.Errorf("second network on VNI 1: %v, want a conflict naming network a", err)
	}
	if _, err := c.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if index() != old {
		t.Error("another network's Teardown removed network a's device")
	}
	if _, err := r.Teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.IP(n.ns, "link", "show", "village.1"); err == nil {
		t.Error("network a's Teardown left its device")
	}
}
