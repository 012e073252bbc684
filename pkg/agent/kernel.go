package agent

import (
	"context"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/overlay"
)

// watchKernel signals on out (capacity 1, coalescing) when the kernel
// reports something a pass may need to repair: an owned route (overlay or
// host shim) deleted, a
// neighbour or FDB entry deleted, an address added or removed (the underlay
// address may have changed). Without notifications (a subscription failed
// or its socket overflowed) the periodic pass still repairs everything.
// An overlay object's deletion signals only when r still wants the object
// (Reconciler.Wanted): the agent's own deletions of what a registry change
// made unwanted are not drift, and a full pass after each of them would
// cost a dump of every route per event.
func watchKernel(ctx context.Context, r *overlay.Reconciler, out chan<- struct{}, logf func(string, ...any)) {
	done := ctx.Done()
	onErr := func(what string) func(error) {
		return func(err error) {
			if ctx.Err() == nil {
				logf("kernel %s notifications: %v (repairs still run every period)", what, err)
			}
		}
	}
	routes := make(chan netlink.RouteUpdate, 256)
	neighs := make(chan netlink.NeighUpdate, 256)
	addrs := make(chan netlink.AddrUpdate, 64)
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{ErrorCallback: onErr("route")}); err != nil {
		onErr("route")(err)
		routes = nil
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{ErrorCallback: onErr("neighbour")}); err != nil {
		onErr("neighbour")(err)
		neighs = nil
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr("address")}); err != nil {
		onErr("address")(err)
		addrs = nil
	}
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	for {
		select {
		case <-done:
			return
		case u, ok := <-routes:
			if !ok {
				routes = nil
				continue
			}
			if u.Type == unix.RTM_DELROUTE && (u.Protocol == macvlan.RouteProtocol ||
				(u.Protocol == overlay.RouteProtocol && r.Wanted(&u.Route, nil))) {
				signal()
			}
		case u, ok := <-neighs:
			if !ok {
				neighs = nil
				continue
			}
			if u.Type == unix.RTM_DELNEIGH && u.State&netlink.NUD_PERMANENT != 0 && r.Wanted(nil, &u.Neigh) {
				signal()
			}
		case _, ok := <-addrs:
			if !ok {
				addrs = nil
				continue
			}
			signal()
		}
	}
}
