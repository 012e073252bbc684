package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/overlay"
)

const (
	// notifyBuffer is each subscription's socket receive buffer. A burst of
	// registry events makes the agent write thousands of objects, and their
	// notifications queue while the watcher waits for the reconciler; a
	// default-sized buffer (rmem_default, about 200 KiB: a few hundred
	// messages) overflows and loses them.
	notifyBuffer = 4 << 20
	// subscriptions is the number of kernel notification groups followed:
	// routes, neighbour and FDB entries, addresses, links.
	subscriptions = 4
)

// kernelWatch follows the kernel's notifications of the node's namespace
// and signals on out (capacity 1, coalescing) when one may have moved the
// kernel away from the reconciler's plan (overlay.Reconciler.Drifts; the
// agent's own writes do not), or deleted an owned host-shim route. It also
// tells the loop whether it has seen everything: while it has, the loop
// reads the whole kernel back only every fullEvery ticks.
//
// Its two counters are the one state the loop shares with another
// goroutine; they are atomic and only ever summarize (the loop asks,
// never waits).
type kernelWatch struct {
	r    *overlay.Reconciler
	out  chan<- struct{}
	logf func(string, ...any)
	// down counts the subscriptions not running: not yet made, failed, or
	// lost to a full socket buffer and not made again yet.
	down atomic.Int32
	// lost is set when a subscription ended: notifications may have been
	// missed until it was made again.
	lost atomic.Bool
}

func newKernelWatch(r *overlay.Reconciler, out chan<- struct{}, logf func(string, ...any)) *kernelWatch {
	w := &kernelWatch{r: r, out: out, logf: logf}
	w.down.Store(subscriptions)
	return w
}

// whole reports whether every notification since the last call was seen:
// each subscription running, and none lost meanwhile.
func (w *kernelWatch) whole() bool {
	lost := w.lost.Swap(false)
	return !lost && w.down.Load() == 0
}

// run follows the subscriptions until ctx is done. A subscription that
// fails or ends (its socket overflowed) is made again after retryEvery,
// and the loop is told that something may have been missed.
func (w *kernelWatch) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		follow(ctx, w, "route", func(ch chan netlink.RouteUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true})
		}, w.route)
	})
	wg.Go(func() {
		follow(ctx, w, "neighbour", func(ch chan netlink.NeighUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.NeighSubscribeWithOptions(ch, done, netlink.NeighSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true})
		}, func(u netlink.NeighUpdate) bool {
			return w.r.Drifts(overlay.KernelEvent{Deleted: u.Type == unix.RTM_DELNEIGH, Neigh: &u.Neigh})
		})
	})
	wg.Go(func() {
		follow(ctx, w, "address", func(ch chan netlink.AddrUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true})
		}, func(u netlink.AddrUpdate) bool {
			// the underlay's address (registered again by the pass's
			// checkSelf) or the VXLAN device's
			return w.r.Drifts(overlay.KernelEvent{Deleted: !u.NewAddr, LinkIndex: u.LinkIndex, Addr: &u.LinkAddress})
		})
	})
	wg.Go(func() {
		follow(ctx, w, "link", func(ch chan netlink.LinkUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true})
		}, func(u netlink.LinkUpdate) bool {
			return w.r.Drifts(overlay.KernelEvent{Deleted: u.Header.Type == unix.RTM_DELLINK, LinkIndex: int(u.Index), Link: u.Link})
		})
	})
	wg.Wait()
}

// route: the reconciler's judgement, and any owned host-shim route deleted
// (repairShim puts it back).
func (w *kernelWatch) route(u netlink.RouteUpdate) bool {
	del := u.Type == unix.RTM_DELROUTE
	return (del && u.Protocol == macvlan.RouteProtocol) || w.r.Drifts(overlay.KernelEvent{Deleted: del, Route: &u.Route})
}

func (w *kernelWatch) signal() {
	select {
	case w.out <- struct{}{}:
	default:
	}
}

// follow keeps one subscription running until ctx is done, signalling for
// each update drifts says is drift. Its socket is closed whenever the
// subscription ends (netlink closes the channel on a receive error, such
// as ENOBUFS, without closing the socket).
func follow[T any](ctx context.Context, w *kernelWatch, what string, subscribe func(chan T, <-chan struct{}, func(error)) error, drifts func(T) bool) {
	for {
		sctx, stop := context.WithCancel(ctx)
		ch := make(chan T, 256)
		err := subscribe(ch, sctx.Done(), func(err error) {
			if sctx.Err() == nil {
				w.logf("kernel %s notifications: %v", what, err)
			}
		})
		if err == nil {
			w.down.Add(-1)
			for u := range ch {
				if drifts(u) {
					w.signal()
				}
			}
			w.down.Add(1)
			w.lost.Store(true)
		}
		stop()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.logf("kernel %s notifications: %v (the whole kernel is read back every period; subscribing again in %s)", what, err, retryEvery)
		} else {
			w.logf("kernel %s notifications ended (some may be lost; the next period reads the whole kernel back); subscribing again in %s", what, retryEvery)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryEvery):
		}
	}
}
