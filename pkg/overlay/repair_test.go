package overlay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// kernelEvents follows n's route and neighbour notifications, as an
// agent's watcher does, until the test ends.
type kernelEvents struct {
	mu  sync.Mutex
	evs []overlay.KernelEvent
}

func followKernel(t *testing.T, n ns.NetNS) *kernelEvents {
	t.Helper()
	h, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	routes, neighs := make(chan netlink.RouteUpdate, 256), make(chan netlink.NeighUpdate, 256)
	fail := func(err error) {
		select {
		case <-done: // the socket closing at the end
		default:
			t.Errorf("notifications of %s: %v", nsName(n), err)
		}
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &h, ErrorCallback: fail}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{Namespace: &h, ErrorCallback: fail}); err != nil {
		t.Fatal(err)
	}
	k := &kernelEvents{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for u := range routes {
			k.add(overlay.KernelEvent{Deleted: u.Type == unix.RTM_DELROUTE, Route: &u.Route})
		}
	})
	wg.Go(func() {
		for u := range neighs {
			k.add(overlay.KernelEvent{Deleted: u.Type == unix.RTM_DELNEIGH, Neigh: &u.Neigh})
		}
	})
	t.Cleanup(func() { close(done); _ = h.Close(); wg.Wait() })
	return k
}

func (k *kernelEvents) add(ev overlay.KernelEvent) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.evs = append(k.evs, ev)
}

// take returns the events so far once both markers (a route to marker and
// a neighbour entry of marker, made after the drift) are among them, and
// forgets them.
func (k *kernelEvents) take(t *testing.T, marker net.IP) []overlay.KernelEvent {
	t.Helper()
	var got []overlay.KernelEvent
	testenv.WaitFor(t, "the drift's notifications", func() error {
		k.mu.Lock()
		defer k.mu.Unlock()
		route, neigh := false, false
		for _, ev := range k.evs {
			route = route || (ev.Route != nil && ev.Route.Dst != nil && ev.Route.Dst.IP.Equal(marker))
			neigh = neigh || (ev.Neigh != nil && ev.Neigh.IP.Equal(marker))
		}
		if !route || !neigh {
			return fmt.Errorf("%d notifications, markers route %v neighbour %v", len(k.evs), route, neigh)
		}
		got, k.evs = k.evs, nil
		return nil
	})
	return got
}

// TestRepairMatchesSet: drift of single routes, neighbour and FDB entries
// (deleted, changed, stray), repaired object by object from the kernel's
// notifications (Repair: no plan, no dump), leaves exactly the kernel a
// full pass leaves: the state of the Set before the drift, and a Set
// after it finds nothing to do. What one object cannot say (the device
// set down) is ErrNeedSet, and Set repairs it.
func TestRepairMatchesSet(t *testing.T) {
	c, nodes, n, r, self, all := repairLab(t, "rp")
	ctx := context.Background()
	full := readState(t, n.ns, "village.1")
	k := followKernel(t, n.ns)
	metric := fmt.Sprint(overlay.Metric("rp"))
	mac2, mac3 := overlay.DeriveMAC(nodes[1].ip4).String(), overlay.DeriveMAC(nodes[2].ip4).String()
	marker := net.ParseIP("192.168.77.250")
	mark := func() {
		testenv.MustIP(t, n.ns, "route", "add", marker.String()+"/32", "dev", "eth0")
		testenv.MustIP(t, n.ns, "neigh", "add", marker.String(), "lladdr", "02:00:00:00:00:fa", "dev", "eth0")
	}
	unmark := func() {
		testenv.MustIP(t, n.ns, "route", "del", marker.String()+"/32", "dev", "eth0")
		testenv.MustIP(t, n.ns, "neigh", "del", marker.String(), "dev", "eth0")
	}
	for _, args := range [][]string{
		{"route", "del", "10.244.2.0/24", "dev", "village.1"},
		{"-6", "route", "change", "fd44:3::/64", "via", "fd44:2::", "dev", "village.1", "onlink", "proto", "86", "metric", metric},
		{"route", "add", "10.244.9.0/24", "via", "10.244.2.0", "dev", "village.1", "onlink", "proto", "86", "metric", metric},
		{"neigh", "del", "10.244.2.0", "dev", "village.1"},
		{"neigh", "replace", "fd44:3::", "lladdr", "0e:00:00:00:00:01", "dev", "village.1", "nud", "permanent"},
		{"neigh", "add", "10.244.9.0", "lladdr", "0e:00:00:00:00:09", "dev", "village.1", "nud", "permanent"},
	} {
		testenv.MustIP(t, n.ns, args...)
	}
	sh(t, n.ns, "bridge", "fdb", "del", mac2, "dev", "village.1", "dst", nodes[1].ip4.String())
	sh(t, n.ns, "bridge", "fdb", "replace", mac3, "dev", "village.1", "dst", "192.168.77.99", "self", "permanent")
	sh(t, n.ns, "bridge", "fdb", "append", "0e:00:00:00:00:09", "dev", "village.1", "dst", "192.168.77.98", "self", "permanent")
	mark()
	drifted := readState(t, n.ns, "village.1")
	var evs []overlay.KernelEvent
	for _, ev := range k.take(t, marker) {
		if r.Drifts(ev) {
			evs = append(evs, ev)
		}
	}
	began := time.Now()
	rep, err := r.Repair(ctx, evs)
	took := time.Since(began)
	if err != nil {
		t.Fatalf("Repair of %d notifications: %v\n%v", len(evs), err, rep)
	}
	t.Logf("Repair of %d drifting notifications took %s: %v", len(evs), took, rep.Applied)
	// the ten drifted objects alone: an FDB entry moved is its entry
	// set back and the new destination deleted, as Set does
	if len(rep.Applied) != 10 {
		t.Errorf("Repair applied %d changes, want 10 (the drifted objects alone):\n%v", len(rep.Applied), rep.Applied)
	}
	if got := readState(t, n.ns, "village.1"); fmt.Sprint(got) != fmt.Sprint(full) {
		t.Fatalf("after Repair the kernel has\n%+v\na full pass left\n%+v\n(drifted: %+v)", got, full, drifted)
	}
	if rep, err := r.Set(ctx, self, all); err != nil || len(rep.Applied) != 0 {
		t.Fatalf("a full pass after Repair: %v, %v", rep.Applied, err)
	}
	unmark()
	c.pingAll(t)

	// The device set down: the kernel drops its routes without a word but
	// announces the link, which only a full pass puts right.
	testenv.MustIP(t, n.ns, "link", "set", "village.1", "down")
	link, err := netlink.LinkByName("lo") // any index but 0 names a link event
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Repair(ctx, []overlay.KernelEvent{{LinkIndex: link.Attrs().Index}}); !errors.Is(err, overlay.ErrNeedSet) {
		t.Fatalf("Repair of a link notification: %v, want ErrNeedSet", err)
	}
	if _, err := r.Set(ctx, self, all); err != nil {
		t.Fatal(err)
	}
	if got := readState(t, n.ns, "village.1"); fmt.Sprint(got) != fmt.Sprint(full) {
		t.Fatalf("after the device came back the kernel has\n%+v\nwant\n%+v", got, full)
	}
}

// TestRepairDevice: the VXLAN device deleted (every peer's entries go with
// it) or set down is made again by RepairDevice alone, as the full pass
// leaves it (up, its MTU, MAC and addresses), without the peers' entries;
// the baseline is dropped, so Repair asks for a Set, and the Set puts the
// rest back to what a full pass left, pods reaching each other again. With
// the device as the pass left it, RepairDevice changes nothing.
func TestRepairDevice(t *testing.T) {
	c, _, n, r, self, all := repairLab(t, "rd")
	ctx := context.Background()
	full, dev := readState(t, n.ns, "village.1"), deviceState(t, n.ns, "village.1")
	if rep, err := r.RepairDevice(ctx); err != nil || len(rep.Applied) != 0 {
		t.Fatalf("RepairDevice with the device as the pass left it: %v, %v", rep.Applied, err)
	}
	for _, gone := range [][]string{{"link", "del", "village.1"}, {"link", "set", "village.1", "down"}} {
		testenv.MustIP(t, n.ns, gone...)
		rep, err := r.RepairDevice(ctx)
		if err != nil || len(rep.Applied) == 0 {
			t.Fatalf("RepairDevice after ip %v: %v, %v", gone, rep.Applied, err)
		}
		if got := deviceState(t, n.ns, "village.1"); got != dev {
			t.Fatalf("after ip %v and RepairDevice the device is\n%s\nthe pass left\n%s", gone, got, dev)
		}
		if st := readState(t, n.ns, "village.1"); fmt.Sprint(st) == fmt.Sprint(full) {
			t.Fatalf("after ip %v and RepairDevice alone the peers' entries are all there: the test deleted nothing", gone)
		}
		if _, err := r.Repair(ctx, nil); !errors.Is(err, overlay.ErrNeedSet) {
			t.Fatalf("Repair after RepairDevice made a change: %v, want ErrNeedSet", err)
		}
		if _, err := r.Set(ctx, self, all); err != nil {
			t.Fatal(err)
		}
		if got := readState(t, n.ns, "village.1"); fmt.Sprint(got) != fmt.Sprint(full) {
			t.Fatalf("after ip %v, RepairDevice and Set the kernel has\n%+v\nwant\n%+v", gone, got, full)
		}
		c.pingAll(t)
	}
}

// TestRepairDeviceGone: the VXLAN device deleted announces its peers'
// entries gone before itself, so an agent may repair those first. Repair
// stops at the first write, which finds no device, and answers
// ErrDeviceGone (an ErrNeedSet) keeping the baseline, so that
// RepairDevice can make the device at once; Set then puts the rest back
// to what a full pass left, and pods reach each other again.
func TestRepairDeviceGone(t *testing.T) {
	c, _, n, r, self, all := repairLab(t, "rg")
	ctx := context.Background()
	full, dev := readState(t, n.ns, "village.1"), deviceState(t, n.ns, "village.1")
	k := followKernel(t, n.ns)
	testenv.MustIP(t, n.ns, "link", "del", "village.1")
	marker := net.ParseIP("192.168.77.251")
	testenv.MustIP(t, n.ns, "route", "add", marker.String()+"/32", "dev", "eth0")
	testenv.MustIP(t, n.ns, "neigh", "add", marker.String(), "lladdr", "02:00:00:00:00:fb", "dev", "eth0")
	var evs []overlay.KernelEvent
	for _, ev := range k.take(t, marker) {
		if r.Drifts(ev) {
			evs = append(evs, ev)
		}
	}
	if len(evs) < 2 {
		t.Fatalf("the device's deletion announced %d planned objects gone, want its peers' entries", len(evs))
	}
	rep, err := r.Repair(ctx, evs)
	if !errors.Is(err, overlay.ErrDeviceGone) || !errors.Is(err, overlay.ErrNeedSet) {
		t.Fatalf("Repair of %d objects of a deleted device: %v, want ErrDeviceGone", len(evs), err)
	}
	if len(rep.Failed) != 1 || len(rep.Applied) != 0 {
		t.Fatalf("Repair of %d objects of a deleted device: applied %v, failed %v; want one failure, then nothing more tried", len(evs), rep.Applied, rep.Failed)
	}
	if rep, err := r.RepairDevice(ctx); err != nil || len(rep.Applied) == 0 {
		t.Fatalf("RepairDevice after ErrDeviceGone: %v, %v", rep.Applied, err)
	}
	if got := deviceState(t, n.ns, "village.1"); got != dev {
		t.Fatalf("after RepairDevice the device is\n%s\nthe pass left\n%s", got, dev)
	}
	if _, err := r.Repair(ctx, nil); !errors.Is(err, overlay.ErrNeedSet) {
		t.Fatalf("Repair after RepairDevice: %v, want ErrNeedSet", err)
	}
	if _, err := r.Set(ctx, self, all); err != nil {
		t.Fatal(err)
	}
	testenv.MustIP(t, n.ns, "route", "del", marker.String()+"/32", "dev", "eth0")
	testenv.MustIP(t, n.ns, "neigh", "del", marker.String(), "dev", "eth0")
	if got := readState(t, n.ns, "village.1"); fmt.Sprint(got) != fmt.Sprint(full) {
		t.Fatalf("after RepairDevice and Set the kernel has\n%+v\nwant\n%+v", got, full)
	}
	c.pingAll(t)
}

// deviceState is dev's state, MTU, MAC and global addresses, as ip shows
// them.
func deviceState(t *testing.T, n ns.NetNS, dev string) string {
	t.Helper()
	var links []struct {
		Flags    []string `json:"flags"`
		MTU      int      `json:"mtu"`
		Address  string   `json:"address"`
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
			Scope     string `json:"scope"`
		} `json:"addr_info"`
	}
	decode(t, testenv.MustIP(t, n, "-j", "addr", "show", "dev", dev), &links)
	if len(links) != 1 {
		t.Fatalf("ip addr show dev %s: %d links", dev, len(links))
	}
	l := links[0]
	s := fmt.Sprintf("up %v mtu %d mac %s", slices.Contains(l.Flags, "UP"), l.MTU, l.Address)
	for _, a := range l.AddrInfo {
		if a.Scope == "global" {
			s += fmt.Sprintf(" %s/%d", a.Local, a.PrefixLen)
		}
	}
	return s
}

// repairLab is three nodes joined over VXLAN in network name, each set
// once: the cluster, its nodes, and node 1 with its reconciler, its own
// record and every node's.
func repairLab(t *testing.T, name string) (*cluster, []*labNode, *labNode, *overlay.Reconciler, overlay.Node, []overlay.Node) {
	_, nodes := threeNodes(t)
	c := newCluster(t, nodes, overlay.Config{Mode: overlay.ModeVXLAN, Network: name}, false)
	c.setAll(t)
	return c, nodes, nodes[0], c.recs[0], nodes[0].node(false), c.all()
}
