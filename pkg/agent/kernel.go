package agent

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/netsetup"
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
	// objectQueue is how many notifications about single routes, neighbour
	// and FDB entries wait for the loop; more before it takes them (a
	// flush of more objects than this) makes the repair a full pass.
	objectQueue = 8192
)

// kernelWatch follows the kernel's notifications of the node's namespace
// and signals on out (capacity 1, coalescing) when one may have moved the
// kernel away from the reconciler's plan (overlay.Reconciler.Drifts; the
// agent's own writes do not), or may have undone one of the node's own
// objects a pass keeps (repairLocal): a host-shim route changed or
// deleted, an address changed while there is a host shim (the kernel
// drops a route whose source address goes, without a notification), a
// host veth of Village's given another MAC. It also tells the loop
// whether it has seen everything: while it has, only the safety net reads
// the whole kernel back.
//
// Its counters and flags are atomic and only ever summarize (the loop
// asks, never waits); the objects it queues reach the loop through a
// channel.
type kernelWatch struct {
	r    *overlay.Reconciler
	out  chan<- struct{}
	logf func(string, ...any)
	// shim: the network has a host shim, whose routes go with an address
	// of the master (set before run).
	shim bool
	// buffer is each subscription's socket receive buffer (notifyBuffer;
	// a test makes it small to overflow it).
	buffer int
	// down counts the subscriptions not running: not yet made, failed, or
	// lost to a full socket buffer and not made again yet.
	down atomic.Int32
	// lost is set when a subscription ended: notifications may have been
	// missed until it was made again.
	lost atomic.Bool
	// objects are the drifting notifications about one route, neighbour
	// or FDB entry each, for the loop's object repair
	// (overlay.Reconciler.Repair); wide is set for one that needs a full
	// pass (a link, an address, a route of someone else, or objects that
	// did not fit in the queue), local for one about the node's own
	// objects (repairLocal). The loop takes them after out says so.
	objects chan overlay.KernelEvent
	wide    atomic.Bool
	local   atomic.Bool
	// urgent is set with wide for the VXLAN device deleted or set down:
	// every peer's traffic stops with it, so the loop makes it again at
	// once rather than after settle.
	urgent atomic.Bool
	// judge is the reconciler's Drifts (a test's stand-in may hold the
	// watcher up).
	judge func(overlay.KernelEvent) bool
	// ns is the namespace followed (nil: the process's).
	ns *netns.NsHandle
}

func newKernelWatch(r *overlay.Reconciler, out chan<- struct{}, logf func(string, ...any)) *kernelWatch {
	w := &kernelWatch{r: r, out: out, logf: logf, buffer: notifyBuffer, objects: make(chan overlay.KernelEvent, objectQueue)}
	if r != nil {
		w.judge = r.Drifts
	}
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
			return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: w.buffer, ReceiveBufferForceSize: true, Namespace: w.ns})
		}, w.route)
	})
	wg.Go(func() {
		follow(ctx, w, "neighbour", func(ch chan netlink.NeighUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.NeighSubscribeWithOptions(ch, done, netlink.NeighSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: w.buffer, ReceiveBufferForceSize: true, Namespace: w.ns})
		}, func(u netlink.NeighUpdate) {
			w.object(overlay.KernelEvent{Deleted: u.Type == unix.RTM_DELNEIGH, Neigh: &u.Neigh})
		})
	})
	wg.Go(func() {
		follow(ctx, w, "address", func(ch chan netlink.AddrUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: w.buffer, ReceiveBufferForceSize: true, Namespace: w.ns})
		}, func(u netlink.AddrUpdate) {
			// with a host shim, any address but a link-local one (the
			// master's: repairShim)
			if w.shim && !u.LinkAddress.IP.IsLinkLocalUnicast() {
				w.flag(&w.local)
			}
			// the underlay's address (registered again by the pass's
			// checkSelf) or the VXLAN device's
			if w.judge(overlay.KernelEvent{Deleted: !u.NewAddr, LinkIndex: u.LinkIndex, Addr: &u.LinkAddress}) {
				w.flag(&w.wide)
			}
		})
	})
	wg.Go(func() {
		follow(ctx, w, "link", func(ch chan netlink.LinkUpdate, done <-chan struct{}, onErr func(error)) error {
			return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr, ReceiveBufferSize: w.buffer, ReceiveBufferForceSize: true, Namespace: w.ns})
		}, func(u netlink.LinkUpdate) {
			del := u.Header.Type == unix.RTM_DELLINK
			if !del && hostVethMoved(u.Link) {
				w.flag(&w.local)
			}
			if w.judge(overlay.KernelEvent{Deleted: del, LinkIndex: int(u.Index), Link: u.Link}) {
				if (del || u.Flags&unix.IFF_UP == 0) && w.r != nil && u.Attrs().Name == w.r.Device() {
					w.urgent.Store(true) // before wide: the loop asks after the signal
				}
				w.flag(&w.wide)
			}
		})
	})
	wg.Wait()
}

// route: any host-shim route changed or deleted (repairShim puts it back
// as it was), and the reconciler's judgement.
func (w *kernelWatch) route(u netlink.RouteUpdate) {
	if u.Protocol == macvlan.RouteProtocol {
		w.flag(&w.local)
		return
	}
	w.object(overlay.KernelEvent{Deleted: u.Type == unix.RTM_DELROUTE, Route: &u.Route})
}

// object queues a drifting notification about one route, neighbour or FDB
// entry for the loop's object repair; one that does not fit makes the
// repair a full pass.
func (w *kernelWatch) object(ev overlay.KernelEvent) {
	if !w.judge(ev) {
		return
	}
	select {
	case w.objects <- ev:
		w.signal()
	default:
		w.flag(&w.wide)
	}
}

// flag sets f and tells the loop.
func (w *kernelWatch) flag(f *atomic.Bool) {
	f.Store(true)
	w.signal()
}

// drift is what the notifications since the last call asked for.
type drift struct {
	objects []overlay.KernelEvent // single objects to repair (Repair)
	wide    bool                  // a full pass
	local   bool                  // repairLocal
}

// take collects what the notifications asked for since the last call.
// The watcher queues or flags before it signals, so whatever it adds
// after this returns comes with a signal of its own.
func (w *kernelWatch) take() drift {
	d := drift{wide: w.wide.Swap(false), local: w.local.Swap(false)}
	for {
		select {
		case ev := <-w.objects:
			d.objects = append(d.objects, ev)
		default:
			return d
		}
	}
}

// hostVethMoved reports whether l is a host veth Village made whose MAC is
// not the derived one (repairHostVeths puts it back).
func hostVethMoved(l netlink.Link) bool {
	return l != nil && netsetup.MadeByVillage(l) && !bytes.Equal(l.Attrs().HardwareAddr, netsetup.HostVethMAC(l.Attrs().Name))
}

func (w *kernelWatch) signal() {
	select {
	case w.out <- struct{}{}:
	default:
	}
}

// follow keeps one subscription running until ctx is done, handing each
// update to judge (which queues or flags what drifts, and signals). Its
// socket is closed whenever the subscription ends (netlink closes the
// channel on a receive error, such as ENOBUFS, without closing the
// socket).
func follow[T any](ctx context.Context, w *kernelWatch, what string, subscribe func(chan T, <-chan struct{}, func(error)) error, judge func(T)) {
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
				judge(u)
			}
			w.down.Add(1)
			w.lost.Store(true)
		}
		stop()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.logf("kernel %s notifications: %v (every tick reads the whole kernel back until they run; subscribing again in %s)", what, err, retryEvery)
		} else {
			w.logf("kernel %s notifications ended (some may be lost; the next tick reads the whole kernel back); subscribing again in %s", what, retryEvery)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryEvery):
		}
	}
}
