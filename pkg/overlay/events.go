package overlay

import (
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// KernelEvent is one kernel notification as an agent's watcher receives
// it: a route, a neighbour or FDB entry (Neigh.Family AF_BRIDGE), or a
// link (LinkIndex), added or changed, or deleted.
type KernelEvent struct {
	Deleted   bool
	Route     *netlink.Route
	Neigh     *netlink.Neigh
	LinkIndex int          // a link notification (RTM_NEWLINK or RTM_DELLINK) about this link, or an address one on it
	Link      netlink.Link // a link notification: the link as the kernel reported it (nil: judged as a change)
	Addr      *net.IPNet   // an address notification (RTM_NEWADDR or RTM_DELADDR): the address
}

// Drifts reports whether ev may have moved the kernel away from the last
// successful Set or Update's plan, so that a Set now has something to put
// right. It is what lets an agent repair on notifications alone and read
// the whole kernel back only seldom: everything a Set compares (routes,
// neighbour and FDB entries, the VXLAN device, the underlay link and its
// addresses) is announced by the kernel when it changes.
//
// True for: a planned (or held) object deleted; a route at a planned
// destination that is not the planned one, whether this network's (changed
// by hand) or someone else's in front of it; a route of this network
// (protocol and metric) at a destination the plan does not have; a
// neighbour or FDB entry on the VXLAN device that differs from the plan,
// or a permanent one the plan does not have; someone else's route deleted
// at a destination whose peer is held for a conflict; the VXLAN device
// deleted or left other than a pass leaves it (down, another MTU, MAC,
// alias or VXLAN attribute), a planned address of it deleted or another
// one added; any notification about the underlay link or an address on it
// (the plan's inputs: its MTU and addresses); link-local addresses never;
// a default route changed when the underlay is the default route's link.
// False for the reconciler's own writes (they are the plan: Update and Set
// hold the lock until the baseline is theirs; a pass that set the device
// up again and gave it its addresses back is told so by the kernel, and
// that is no drift), and for other networks' and other devices' objects.
// Without a baseline the deletion of a route of this network is true
// (nothing is known) and anything else false (the first Set reads
// everything anyway; after a failed one the agent's next tick does).
func (r *Reconciler) Drifts(ev KernelEvent) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.base
	switch {
	case ev.Addr != nil && ev.Addr.IP.IsLinkLocalUnicast():
		return false // the kernel's own (IPv6 link-local): no pass reads them
	case ev.LinkIndex != 0:
		return b != nil && r.linkDrifts(b, ev)
	case ev.Route != nil && ev.Deleted:
		return b.routeDeleted(ev.Route, r.metric)
	case ev.Neigh != nil && ev.Deleted:
		// planned, whatever the state the kernel reports it in (a
		// permanent neighbour entry deleted is reported FAILED)
		return b != nil && b.onVTEP(ev.Neigh.LinkIndex) && b.entryPlanned(ev.Neigh)
	case b == nil:
		return false
	case ev.Route != nil && (ev.Route.Dst == nil || ev.Route.Dst.IP.IsUnspecified()):
		// a default route: it names the underlay when no interface is configured
		return r.cfg.Underlay == "" && ev.Route.Table == unix.RT_TABLE_MAIN
	case ev.Route != nil:
		return b.routeDrifts(ev.Route, r.metric)
	case ev.Neigh != nil:
		return b.neighDrifts(ev.Neigh)
	}
	return false
}

// routeDeleted: a deleted route k against the plan (b nil: none). This
// network's route (protocol and metric, or of before the metrics) is
// drift when it is planned or held, and whenever there is no plan;
// someone else's only when it stood in front of a held peer's route (that
// peer can be planned now).
func (b *baseline) routeDeleted(k *netlink.Route, metric int) bool {
	if k.Dst == nil {
		return false
	}
	ours := k.Protocol == RouteProtocol && (k.Priority == metric || k.Priority == defaultPriority(k.Dst.IP))
	if b == nil {
		return ours
	}
	key := canonical(k.Dst).String()
	if !ours {
		return b.d.held[objKey(KindRoute, key)]
	}
	_, planned := b.d.routes[key]
	legacy := k.Priority != metric // of before the metrics: Set takes it over
	return legacy || planned || b.d.held[objKey(KindRoute, key)]
}

// linkDrifts: a link notification, or an address one, against the plan.
// Any about the underlay link is drift. About the VXLAN device, one that
// says the device is as a pass leaves it is not: the spec is the one the
// pass that made the baseline ensured (the same underlay and self).
func (r *Reconciler) linkDrifts(b *baseline, ev KernelEvent) bool {
	u := b.e.u.link
	if u != nil && ev.LinkIndex == u.Attrs().Index {
		return true
	}
	if !b.onVTEP(ev.LinkIndex) {
		return false
	}
	if u == nil {
		return true // no spec to judge by
	}
	s := r.vtepSpecFor(b.e.u, b.self)
	switch {
	case ev.Addr != nil:
		return s.hasAddr(ev.Addr) == ev.Deleted // a planned one gone, or another one come
	case ev.Deleted || ev.Link == nil:
		return true
	}
	return !s.settled(ev.Link)
}

// onVTEP reports whether link index is the plan's VXLAN device.
func (b *baseline) onVTEP(index int) bool { return b.e.vtep.index != 0 && index == b.e.vtep.index }

// entryPlanned reports whether the plan has (or holds) a neighbour or FDB
// entry (Family AF_BRIDGE) where n is: the same address, or for an FDB
// entry the same MAC and destination.
func (b *baseline) entryPlanned(n *netlink.Neigh) bool {
	if n.Family == unix.AF_BRIDGE {
		k := n.HardwareAddr.String()
		f, ok := b.d.fdbs[k]
		return (ok && f.dst.Equal(n.IP)) || b.d.held[objKey(KindFDB, k)]
	}
	k := n.IP.String()
	_, ok := b.d.neighs[k]
	return ok || b.d.held[objKey(KindNeigh, k)]
}

// routeDrifts: a new or changed main-table route k against the plan.
func (b *baseline) routeDrifts(k *netlink.Route, metric int) bool {
	if k.Dst == nil || (k.Table != unix.RT_TABLE_MAIN && k.Table != 0) {
		return false
	}
	want, planned := b.d.routes[canonical(k.Dst).String()]
	if ownedRoute(k, metric, planned, b.e.vtep.index) {
		return !planned || !want.matches(*k) // stray, or not the planned one (one of before the metrics never is)
	}
	return planned && k.Priority <= want.priority() // someone else's, in front of the planned route
}

// neighDrifts: a new or changed neighbour or FDB entry n against the plan.
func (b *baseline) neighDrifts(n *netlink.Neigh) bool {
	if !b.onVTEP(n.LinkIndex) {
		return false
	}
	if n.Family == unix.AF_BRIDGE {
		if f, ok := b.d.fdbs[n.HardwareAddr.String()]; ok {
			return !f.matches(*n)
		}
	} else if want, ok := b.d.neighs[n.IP.String()]; ok {
		return !want.matches(*n)
	}
	return vtepEntry(n) // an entry Set would find and delete
}

// vtepEntry reports whether n is an entry a pass reads as one of the VXLAN
// device's (and deletes when the plan does not have it): permanent, with
// an address and a MAC. Those the kernel makes itself are not.
func vtepEntry(n *netlink.Neigh) bool {
	return n.State&netlink.NUD_PERMANENT != 0 && n.IP != nil && len(n.HardwareAddr) > 0
}
