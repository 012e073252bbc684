package overlay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dumpRetries bounds re-dumps when the kernel reports a dump interrupted by
// a concurrent change (NLM_F_DUMP_INTR).
const dumpRetries = 5

// observed is what the kernel has, read with one dump per kind.
type observed struct {
	owned   []netlink.Route          // our protocol, in this network's scope
	foreign map[string]netlink.Route // other protocols, by routeSlot
	neighs  []netlink.Neigh          // permanent entries on the VXLAN device
	fdbs    []netlink.Neigh          // permanent entries with a destination on it
	devs    map[int]string           // link names of owned routes

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

// routeSlot is what the kernel matches on when replacing a route.
func routeSlot(dst string, priority int) string { return dst + "|" + strconv.Itoa(priority) }

func (r *Reconciler) observe(vtep linkRef, known ...linkRef) (observed, error) {
	o := observed{foreign: map[string]netlink.Route{}, devs: map[int]string{}}
	for _, l := range append(known, vtep) {
		if l.index != 0 {
			o.devs[l.index] = l.name
		}
	}
	if err := r.observeRoutes(&o); err != nil {
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

func (r *Reconciler) observeRoutes(o *observed) error {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := r.routeDump(fam)
		if err != nil {
			return err
		}
		for _, rt := range routes {
			switch {
			case rt.Dst == nil:
				// default routes are never ours and never in the way
			case rt.Protocol != RouteProtocol:
				o.foreign[routeSlot(rt.Dst.String(), rt.Priority)] = rt
			case r.inScope(o, rt.LinkIndex):
				o.owned = append(o.owned, rt)
			}
		}
	}
	return nil
}

// inScope reports whether an owned route belongs to this network: anything
// with our protocol except routes on another network's VXLAN device.
func (r *Reconciler) inScope(o *observed, index int) bool {
	name, ok := o.devs[index]
	if !ok {
		if link, err := r.h.LinkByIndex(index); err == nil {
			name = link.Attrs().Name
		}
		o.devs[index] = name
	}
	return !strings.HasPrefix(name, DevicePrefix) || name == r.Device()
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
