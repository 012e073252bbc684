package netsetup

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/internal/testenv"
)

func TestDefaultRouteLink(t *testing.T) {
	node := testenv.NewNS(t)
	find := func() (string, int) {
		t.Helper()
		var name string
		var family int
		if err := testenv.InNS(node, func() error {
			link, fam, err := DefaultRouteLink(nil)
			if link != nil {
				name = link.Attrs().Name
			}
			family = fam
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return name, family
	}
	if name, _ := find(); name != "" {
		t.Fatalf("no default route yet, got %q", name)
	}
	testenv.MustIP(t, node, "link", "add", "up0", "type", "veth", "peer", "name", "up1")
	testenv.MustIP(t, node, "link", "add", "lan0", "type", "veth", "peer", "name", "lan1")
	for _, l := range []string{"up0", "up1", "lan0", "lan1"} {
		testenv.MustIP(t, node, "link", "set", l, "up")
	}
	testenv.MustIP(t, node, "-6", "addr", "add", "fd99::1/64", "dev", "up0", "nodad")
	testenv.MustIP(t, node, "-6", "route", "add", "default", "via", "fd99::2", "dev", "up0")
	if name, fam := find(); name != "up0" || fam != netlink.FAMILY_V6 {
		t.Fatalf("IPv6-only default route: %q family %d", name, fam)
	}
	// IPv4 wins when both exist.
	testenv.MustIP(t, node, "addr", "add", "192.168.99.1/24", "dev", "lan0")
	testenv.MustIP(t, node, "route", "add", "default", "via", "192.168.99.2", "dev", "lan0")
	if name, fam := find(); name != "lan0" || fam != netlink.FAMILY_V4 {
		t.Fatalf("dual default routes: %q family %d, want lan0 (IPv4)", name, fam)
	}
}
