package overlay

import (
	"errors"
	"fmt"
	"maps"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// dumpRetries bounds re-dumps when the kernel reports a dump interrupted by
// a concurrent change (NLM_F_DUMP_INTR).
const dumpRetries = 5

// current is the state the engine (apply) compares a plan with: this
// network's routes, neighbour and FDB entries as the kernel carries them
// (observe: one dump per kind, for Set and Status), or as the last
// successful pass left them (believed: the baseline plan, for Update, which
// reads nothing back).
type current struct {
	owned  []keyed[netlink.Route]     // this network's: our protocol and metric
	others map[string][]netlink.Route // everyone else's (other protocols, other networks), by destination
	neighs []keyed[netlink.Neigh]     // permanent entries on the VXLAN device
	fdbs   []keyed[netlink.Neigh]     // permanent entries with a destination on it
	devs   map[int]string             // link names of owned objects
	// blind: only this network's objects are known (a baseline, not a
	// dump), so others is empty and someone else's route in the way of a
	// new one is asked of the kernel (blockerOf).
	blind bool
	// dumps are the route dumps a blind pass made, by family (at most one
	// each per pass; see blockerOf).
	dumps map[int][]netlink.Route

	// the above by key (destination, address, MAC): the kernel's identity
	// of each kind
	ownedByDst map[string][]keyed[netlink.Route]
	neighByIP  map[string][]keyed[netlink.Neigh]
	fdbByMAC   map[string][]keyed[netlink.Neigh]
}

// keyed is a kernel object with its key (destination, address or MAC).
type keyed[T any] struct {
	key string
	obj T
}

// byKey indexes s by key. A key's first object is a slice of s itself (no
// copy: most keys have one); a second one makes that key's own list.
func byKey[T any](s []keyed[T]) map[string][]keyed[T] {
	m := make(map[string][]keyed[T], len(s))
	for i := range s {
		if have, ok := m[s[i].key]; ok {
			m[s[i].key] = append(have[:len(have):len(have)], s[i])
			continue
		}
		m[s[i].key] = s[i : i+1 : i+1]
	}
	return m
}

func (o *current) index() {
	o.ownedByDst, o.neighByIP, o.fdbByMAC = byKey(o.owned), byKey(o.neighs), byKey(o.fdbs)
}

// blocker is a route of someone else at want's destination that the kernel
// would prefer to want (a metric no higher), nil when there is none.
func (o *current) blocker(want route) *netlink.Route {
	others := o.others[want.key()]
	for i := range others { // by index: a range variable whose address is taken is a heap copy per call
		if others[i].Priority <= want.priority() {
			return &others[i]
		}
	}
	return nil
}

// believed is what the kernel carries after plan d was applied without a
// failure: its objects as the kernel writes them.
func believed(d desired) current {
	o := current{blind: true, devs: map[int]string{}, dumps: map[int][]netlink.Route{},
		owned:      make([]keyed[netlink.Route], 0, len(d.routes)),
		neighs:     make([]keyed[netlink.Neigh], 0, len(d.neighs)),
		fdbs:       make([]keyed[netlink.Neigh], 0, len(d.fdbs)),
		ownedByDst: make(map[string][]keyed[netlink.Route], len(d.routes)),
		neighByIP:  make(map[string][]keyed[netlink.Neigh], len(d.neighs)),
		fdbByMAC:   make(map[string][]keyed[netlink.Neigh], len(d.fdbs)),
	}
	for k, rt := range d.routes {
		o.owned = append(o.owned, keyed[netlink.Route]{k, *rt.spec()})
		o.ownedByDst[k] = last(o.owned)
		o.devs[rt.link.index] = rt.link.name
	}
	for k, n := range d.neighs {
		o.neighs = append(o.neighs, keyed[netlink.Neigh]{k, *n.spec()})
		o.neighByIP[k] = last(o.neighs)
		o.devs[n.link.index] = n.link.name
	}
	for k, f := range d.fdbs {
		o.fdbs = append(o.fdbs, keyed[netlink.Neigh]{k, *f.spec()})
		o.fdbByMAC[k] = last(o.fdbs)
		o.devs[f.link.index] = f.link.name
	}
	return o
}

// last is the last element of s as a slice of its own (no room to append).
func last[T any](s []T) []T { return s[len(s)-1 : len(s) : len(s)] }

// observe reads the routes, and the neighbour and FDB entries of vtep.
// d is the pass's plan: a route Village made before routes
// carried the network's metric (protocol RouteProtocol, the kernel's
// default metric) is taken over as this network's when it goes to one of
// those destinations or lies on this network's VXLAN device, so an upgrade
// replaces it instead of leaving it in front of the new one.
func (r *Reconciler) observe(vtep linkRef, d desired, known ...linkRef) (current, error) {
	o := current{others: map[string][]netlink.Route{}, devs: map[int]string{}}
	for _, l := range append(known, vtep) {
		if l.index != 0 {
			o.devs[l.index] = l.name
		}
	}
	if err := r.observeRoutes(&o, vtep, d.routes); err != nil {
		return o, err
	}
	if vtep.index != 0 {
		var err error
		if o.neighs, err = r.vtepEntries(vtep, netlink.FAMILY_ALL, len(d.neighs), func(n netlink.Neigh) string { return n.IP.String() }); err != nil {
			return o, err
		}
		if o.fdbs, err = r.vtepEntries(vtep, unix.AF_BRIDGE, len(d.fdbs), func(n netlink.Neigh) string { return n.HardwareAddr.String() }); err != nil {
			return o, err
		}
	}
	o.index()
	return o, nil
}

// observeRoutes sorts the main table's routes as they stream from the dump
// (no list of them is kept): this network's into o.owned, and of everyone
// else's only those at a destination the pass plans, the only ones a
// blocker check asks about. At 5,000 peers the dump is most of a periodic
// pass's allocations (docs/performance.md, "The periodic pass at 5,000
// peers").
func (r *Reconciler) observeRoutes(o *current, vtep linkRef, wanted map[string]route) error {
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN}
	o.owned = make([]keyed[netlink.Route], 0, len(wanted))
	var links []int // owned routes' links not named yet: asked after the dump
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		from, linksFrom, others := len(o.owned), len(links), map[string][]netlink.Route{}
		var err error
		for range dumpRetries {
			o.owned, links = o.owned[:from], links[:linksFrom] // an interrupted dump starts over
			clear(others)
			err = r.h.RouteListFilteredIter(fam, filter, netlink.RT_FILTER_TABLE, func(rt netlink.Route) bool {
				if rt.Dst == nil {
					return true // default routes are never ours and never in the way
				}
				k := rt.Dst.String()
				_, want := wanted[k]
				switch {
				case ownedRoute(&rt, r.metric, want, vtep.index):
					o.owned = append(o.owned, keyed[netlink.Route]{k, rt})
					if _, ok := o.devs[rt.LinkIndex]; !ok {
						links = append(links, rt.LinkIndex)
					}
				case want:
					others[k] = append(others[k], rt)
				}
				return true
			})
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("listing %s routes: %w", familyName(fam), err)
		}
		maps.Copy(o.others, others)
	}
	for _, index := range links {
		r.linkName(o, index)
	}
	return nil
}

// ownedRoute reports whether a pass takes route rt as this network's:
// its protocol and metric, or its protocol and the kernel's default
// metric (a route of before the metrics) at a destination the plan has
// (planned) or on the VXLAN device (vtepIndex, 0 when there is none).
func ownedRoute(rt *netlink.Route, metric int, planned bool, vtepIndex int) bool {
	if rt.Protocol != RouteProtocol {
		return false
	}
	legacy := rt.Priority == defaultPriority(rt.Dst.IP) && (planned || (vtepIndex != 0 && rt.LinkIndex == vtepIndex))
	return rt.Priority == metric || legacy
}

// linkName records the name of a link owned routes are on (for reports).
func (r *Reconciler) linkName(o *current, index int) {
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
// (AF_BRIDGE) entries of the VXLAN device, each under its key, in a list
// sized for the expected number (the plan's); entries the kernel made
// itself (incomplete, stale, multicast) are not ours and are left out.
func (r *Reconciler) vtepEntries(vtep linkRef, family, expect int, key func(netlink.Neigh) string) ([]keyed[netlink.Neigh], error) {
	kept := make([]keyed[netlink.Neigh], 0, expect)
	var err error
	for range dumpRetries {
		kept = kept[:0] // an interrupted dump starts over
		err = r.neighDump(netlink.Ndmsg{Family: uint8(family), Index: uint32(vtep.index)}, func(n *netlink.Neigh) {
			if n.LinkIndex == vtep.index && vtepEntry(n) {
				kept = append(kept, keyed[netlink.Neigh]{key(*n), *n})
			}
		})
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s entries of %s: %w", familyName(family), vtep.name, err)
	}
	return kept, nil
}

// neighDump hands each entry of a neighbour or FDB dump to f as it
// arrives. netlink's NeighList copies every message and then builds a list
// of every entry, which at 5,000 peers was a third of a periodic pass's
// allocations (docs/performance.md, "The periodic pass at 5,000 peers");
// its Handle does not lend its socket, so the dumps have one of their own
// in the same namespace. The error is ErrDumpInterrupted when the entries
// changed during the dump.
func (r *Reconciler) neighDump(msg netlink.Ndmsg, f func(*netlink.Neigh)) error {
	if r.dump == nil {
		s, err := dumpSocket(r.cfg.NetNS)
		if err != nil {
			return err
		}
		r.dump = &nl.SocketHandle{Socket: s}
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: r.dump}
	req.AddData(&msg)
	return req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH, func(m []byte) bool {
		if n, err := netlink.NeighDeserialize(m); err == nil { // what NeighList skips too
			f(n)
		}
		return true
	})
}

// dumpSocket opens a route netlink socket in the namespace at path (the
// current one when empty).
func dumpSocket(path string) (*nl.NetlinkSocket, error) {
	var s *nl.NetlinkSocket
	err := atNamespace(path, func(at netns.NsHandle) (err error) {
		if s, err = nl.GetNetlinkSocketAt(at, netns.None(), unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("opening a netlink socket for dumps%s: %w", inPath(path), err)
		}
		return nil
	})
	return s, err
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
