package overlay

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dumpRetries bounds re-dumps when the kernel reports a dump interrupted by
// a concurrent change (NLM_F_DUMP_INTR).
const dumpRetries = 5

// observed is what the kernel has, read with one dump per kind.
type observed struct {
	owned  []netlink.Route            // this network's: our protocol and metric
	others map[string][]netlink.Route // everyone else's (other protocols, other networks), by destination
	neighs []netlink.Neigh            // permanent entries on the VXLAN device
	fdbs   []netlink.Neigh            // permanent entries with a destination on it
	devs   map[int]string             // link names of owned routes

	// indexes of the above by the kernel's identity of each kind
	ownedByDst map[string][]netlink.Route
	neighByIP  map[string][]netlink.Neigh
	fdbByMAC   map[string][]netlink.Neigh
}

func (o *observed) index() {
	o.ownedByDst = make(map[string][]netlink.Route, len(o.owned))
	o.neighByIP = make(map[string][]netlink.Neigh, len(o.neighs))
	o.fdbByMAC = make(map[string][]netlink.Neigh, len(o.fdbs))
	for _, rt := range o.owned {
		o.ownedByDst[rt.Dst.String()] = append(o.ownedByDst[rt.Dst.String()], rt)
	}
	for _, n := range o.neighs {
		o.neighByIP[n.IP.String()] = append(o.neighByIP[n.IP.String()], n)
	}
	for _, n := range o.fdbs {
		o.fdbByMAC[n.HardwareAddr.String()] = append(o.fdbByMAC[n.HardwareAddr.String()], n)
	}
}

// blocker is a route of someone else at want's destination that the kernel
// would prefer to want (a metric no higher), nil when there is none.
func (o *observed) blocker(want route) *netlink.Route {
	for _, rt := range o.others[want.key()] {
		if rt.Priority <= want.priority() {
			return &rt
		}
	}
	return nil
}

// observe reads the routes, and the neighbour and FDB entries of vtep.
// wanted are the routes the pass plans: a route Village made before routes
// carried the network's metric (protocol RouteProtocol, the kernel's
// default metric) is taken over as this network's when it goes to one of
// those destinations or lies on this network's VXLAN device, so an upgrade
// replaces it instead of leaving it in front of the new one.
func (r *Reconciler) observe(vtep linkRef, wanted map[string]route, known ...linkRef) (observed, error) {
	o := observed{others: map[string][]netlink.Route{}, devs: map[int]string{}}
	for _, l := range append(known, vtep) {
		if l.index != 0 {
			o.devs[l.index] = l.name
		}
	}
	if err := r.observeRoutes(&o, vtep, wanted); err != nil {
		return o, err
	}
	if vtep.index != 0 {
		var err error
		if o.neighs, err = r.vtepEntries(vtep, netlink.FAMILY_ALL); err != nil {
			return o, err
		}
		if o.fdbs, err = r.vtepEntries(vtep, unix.AF_BRIDGE); err != nil {
			return o, err
		}
	}
	o.index()
	return o, nil
}

func (r *Reconciler) observeRoutes(o *observed, vtep linkRef, wanted map[string]route) error {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := r.routeDump(fam)
		if err != nil {
			return err
		}
		for _, rt := range routes {
			if rt.Dst == nil {
				continue // default routes are never ours and never in the way
			}
			_, want := wanted[rt.Dst.String()]
			legacy := rt.Protocol == RouteProtocol && rt.Priority == defaultPriority(rt.Dst.IP) &&
				(want || (vtep.index != 0 && rt.LinkIndex == vtep.index))
			if (rt.Protocol == RouteProtocol && rt.Priority == r.metric) || legacy {
				o.owned = append(o.owned, rt)
				r.linkName(o, rt.LinkIndex)
				continue
			}
			o.others[rt.Dst.String()] = append(o.others[rt.Dst.String()], rt)
		}
	}
	return nil
}

// linkName records the name of a link owned routes are on (for reports).
func (r *Reconciler) linkName(o *observed, index int) {
	if _, ok := o.devs[index]; ok {
		return
	}
	if link, err := r.h.LinkByIndex(index); err == nil {
		o.devs[index] = link.Attrs().Name
	}
}

// routeDump lists the main table's routes of one family.
func (r *Reconciler) routeDump(family int) ([]netlink.Route, error) {
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN}
	var err error
	for range dumpRetries {
		var routes []netlink.Route
		routes, err = r.h.RouteListFiltered(family, filter, netlink.RT_FILTER_TABLE)
		if err == nil {
			return routes, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("listing %s routes: %w", familyName(family), err)
}

// vtepEntries lists the permanent neighbour (family FAMILY_ALL) or FDB
// (AF_BRIDGE) entries of the VXLAN device; entries the kernel made itself
// (incomplete, stale, multicast) are not ours and are left out.
func (r *Reconciler) vtepEntries(vtep linkRef, family int) ([]netlink.Neigh, error) {
	var (
		all []netlink.Neigh
		err error
	)
	for range dumpRetries {
		if all, err = r.h.NeighList(vtep.index, family); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s entries of %s: %w", familyName(family), vtep.name, err)
	}
	kept := all[:0]
	for _, n := range all {
		if n.LinkIndex == vtep.index && n.State&netlink.NUD_PERMANENT != 0 && n.IP != nil && len(n.HardwareAddr) > 0 {
			kept = append(kept, n)
		}
	}
	return kept, nil
}

func familyName(f int) string {
	switch f {
	case netlink.FAMILY_V4:
		return "IPv4"
	case netlink.FAMILY_V6:
		return "IPv6"
	case unix.AF_BRIDGE:
		return "FDB"
	}
	return "neighbour"
}

// gone reports a delete error that means the object is already absent.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV)
}
