package overlay

import (
	"fmt"
	"maps"
	"slices"

	"github.com/vishvananda/netlink"
)

// applyDiff brings the kernel from o to d: additions and replacements first
// (FDB, then neighbours, then the routes using them), deletions after
// (routes, then neighbours, then FDB), each in a stable order.
func (r *Reconciler) applyDiff(rc *recorder, d desired, o observed) {
	addEntries(r, rc, d.fdbs, o.fdbByMAC)
	addEntries(r, rc, d.neighs, o.neighByIP)
	r.addRoutes(rc, d, o)
	r.deleteRoutes(rc, d, o)
	r.deleteNeighs(rc, d, o)
	r.deleteFDBs(rc, d, o)
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// entry is a desired permanent neighbour or FDB entry: both are written
// with NeighSet and compared with what the kernel has under the same key.
type entry interface {
	object() Object
	spec() *netlink.Neigh
	matches(netlink.Neigh) bool
}

// addEntries writes every wanted entry the kernel does not have exactly:
// an add when nothing is under its key, a replace when something else is.
func addEntries[E entry](r *Reconciler, rc *recorder, wanted map[string]E, have map[string][]netlink.Neigh) {
	for _, k := range sortedKeys(wanted) {
		want := wanted[k]
		op := OpAdd
		found := false
		for _, h := range have[k] {
			op = OpReplace
			found = found || want.matches(h)
		}
		if !found {
			_ = rc.do(Change{op, want.object()}, func() error { return r.h.NeighSet(want.spec()) })
		}
	}
}

func (r *Reconciler) addRoutes(rc *recorder, d desired, o observed) {
	for _, k := range sortedKeys(d.routes) {
		want := d.routes[k]
		if f := o.blocker(want); f != nil {
			c := Change{OpAdd, want.object()}
			_ = rc.fail(c, conflictErr(c, f))
			continue
		}
		op := OpAdd
		found := false
		for _, have := range o.ownedByDst[k] {
			if have.Priority == want.priority() {
				op = OpReplace
				found = found || want.matches(have)
			}
		}
		if !found {
			_ = rc.do(Change{op, want.object()}, func() error { return r.h.RouteReplace(want.spec()) })
		}
	}
}

func (r *Reconciler) deleteRoutes(rc *recorder, d desired, o observed) {
	for _, have := range o.owned {
		k := have.Dst.String()
		if want, ok := d.routes[k]; ok && have.Priority == want.priority() {
			continue // matched, or replaced in place above
		}
		if d.held[objKey(KindRoute, k)] {
			continue
		}
		have := have
		c := Change{OpDelete, kernelRouteObject(have, o.devs[have.LinkIndex])}
		_ = rc.do(c, func() error { return ignoreGone(r.h.RouteDel(&have)) })
	}
}

func (r *Reconciler) deleteNeighs(rc *recorder, d desired, o observed) {
	for _, have := range o.neighs {
		k := have.IP.String()
		if _, ok := d.neighs[k]; ok || d.held[objKey(KindNeigh, k)] {
			continue
		}
		have := have
		c := Change{OpDelete, Object{Kind: KindNeigh, Desc: fmt.Sprintf("%s lladdr %s dev %s", have.IP, have.HardwareAddr, o.devs[have.LinkIndex])}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.NeighDel(&have)) })
	}
}

func (r *Reconciler) deleteFDBs(rc *recorder, d desired, o observed) {
	for _, have := range o.fdbs {
		k := have.HardwareAddr.String()
		if want, ok := d.fdbs[k]; (ok && want.dst.Equal(have.IP)) || d.held[objKey(KindFDB, k)] {
			continue
		}
		spec := fdbSpec(have.LinkIndex, have.HardwareAddr, have.IP)
		c := Change{OpDelete, Object{Kind: KindFDB, Desc: fmt.Sprintf("%s dst %s dev %s", have.HardwareAddr, have.IP, o.devs[have.LinkIndex])}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.NeighDel(spec)) })
	}
}

// conflictErr is the failure of adding a route where someone else's is.
func conflictErr(c Change, f *netlink.Route) error {
	whose := "of protocol " + f.Protocol.String()
	if f.Protocol == RouteProtocol {
		whose = fmt.Sprintf("of another Village network (metric %d)", f.Priority)
	}
	return fmt.Errorf("%s: a route %s is already there (%s): %w", c, whose, f, ErrConflict)
}

func ignoreGone(err error) error {
	if err != nil && gone(err) {
		return nil
	}
	return err
}
