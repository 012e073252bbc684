package agent

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// TestKernelWatchOverflow: a route subscription whose socket overflows
// (its reader held up while the kernel sends thousands of notifications
// into a small buffer) ends, the next tick is a full pass, and once the
// subscription is made again the watch is whole: the tick after that
// reads nothing back, and the new subscription delivers.
func TestKernelWatchOverflow(t *testing.T) {
	n := testenv.NewNS(t)
	h, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nh.Close)
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v0"}, PeerName: "v1"} // no link module on every kernel
	if err := nh.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	if err := nh.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}

	out := make(chan struct{}, 1)
	w := newKernelWatch(nil, out, t.Logf)
	w.ns, w.buffer = &h, 4096
	stalled, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	var routes atomic.Int64
	w.judge = func(ev overlay.KernelEvent) bool {
		if ev.Route == nil {
			return false
		}
		first.Do(func() { close(stalled); <-release }) // the reader held up
		routes.Add(1)
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	a := &agent{watch: w}

	// whole waits for every subscription to run, then asks a tick.
	whole := func(what string) {
		t.Helper()
		testenv.WaitFor(t, what, func() error {
			if d := w.down.Load(); d != 0 {
				return fmt.Errorf("%d subscriptions down", d)
			}
			return nil
		})
		if a.fullDue() {
			t.Fatalf("%s: a tick with the watch whole would read the kernel back", what)
		}
	}
	whole("every subscription made")
	add := func(i int) {
		t.Helper()
		dst := &net.IPNet{IP: net.IPv4(10, 80+byte(i/250), byte(i%250), 0).To4(), Mask: net.CIDRMask(24, 32)}
		if err := nh.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst}); err != nil {
			t.Fatalf("adding route %d: %v", i, err)
		}
	}
	add(0)
	<-stalled
	for i := 1; i < 3000; i++ { // far more than the socket and the channel hold
		add(i)
	}
	close(release)
	testenv.WaitFor(t, "the overflowed subscription ends", func() error {
		if !w.lost.Load() {
			return fmt.Errorf("no subscription lost (%d route notifications judged)", routes.Load())
		}
		return nil
	})
	if !a.fullDue() {
		t.Fatal("the tick after an overflow must read the whole kernel back")
	}
	whole("the route subscription made again")
	before := routes.Load()
	add(3000)
	testenv.WaitFor(t, "the new subscription delivers", func() error {
		if routes.Load() == before {
			return fmt.Errorf("no route notification since it was made again")
		}
		return nil
	})
}
