package overlay

import (
	"fmt"
	"maps"
	"slices"
)

// applyDiff brings the kernel from o to d: additions and replacements first
// (FDB, then neighbours, then the routes using them), deletions after
// (routes, then neighbours, then FDB), each in a stable order.
func (r *Reconciler) applyDiff(rc *recorder, d desired, o observed) {
	r.addFDBs(rc, d, o)
	r.addNeighs(rc, d, o)
	r.addRoutes(rc, d, o)
	r.deleteRoutes(rc, d, o)
	r.deleteNeighs(rc, d, o)
	r.deleteFDBs(rc, d, o)
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

func (r *Reconciler) addFDBs(rc *recorder, d desired, o observed) {
	for _, k := range sortedKeys(d.fdbs) {
		want := d.fdbs[k]
		op := OpAdd
		found := false
		for _, have := range o.fdbByMAC[k] {
			op = OpReplace
			found = found || want.matches(have)
		}
		if !found {
			_ = rc.do(Change{op, want.object()}, func() error { return r.h.NeighSet(want.spec()) })
		}
	}
}

func (r *Reconciler) addNeighs(rc *recorder, d desired, o observed) {
	for _, k := range sortedKeys(d.neighs) {
		want := d.neighs[k]
		op := OpAdd
		found := false
		for _, have := range o.neighByIP[k] {
			op = OpReplace
			found = found || want.matches(have)
		}
		if !found {
			_ = rc.do(Change{op, want.object()}, func() error { return r.h.NeighSet(want.spec()) })
		}
	}
}

func (r *Reconciler) addRoutes(rc *recorder, d desired, o observed) {
	for _, k := range sortedKeys(d.routes) {
		want := d.routes[k]
		if f, ok := o.foreign[routeSlot(k, want.priority())]; ok {
			c := Change{OpAdd, want.object()}
			_ = rc.fail(c, fmt.Errorf("%s: a route of protocol %s is already there (%s): %w", c, f.Protocol, f, ErrConflict))
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

func ignoreGone(err error) error {
	if err != nil && gone(err) {
		return nil
	}
	return err
}
