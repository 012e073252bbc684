package overlay

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// apply is the one engine that turns a plan into kernel writes, for Set
// (cur observed from the kernel) and Update (cur believed from the last
// plan): additions and replacements first (FDB, then neighbours, then the
// routes using them), deletions after (routes, then neighbours, then FDB),
// each kind in key order. Only this network's objects are ever changed or
// deleted; held objects (of peers that could not be planned) stay.
func (r *Reconciler) apply(rc *recorder, d desired, cur current) {
	addEntries(r, rc, d.fdbs, cur.fdbByMAC)
	addEntries(r, rc, d.neighs, cur.neighByIP)
	r.addRoutes(rc, d, cur)
	r.deleteRoutes(rc, d, cur)
	r.deleteNeighs(rc, d, cur)
	r.deleteFDBs(rc, d, cur)
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
func addEntries[E entry](r *Reconciler, rc *recorder, wanted map[string]E, have map[string][]keyed[netlink.Neigh]) {
	for _, k := range sortedKeys(wanted) {
		want := wanted[k]
		op := OpAdd
		found := false
		for _, h := range have[k] {
			op = OpReplace
			found = found || want.matches(h.obj)
		}
		if !found {
			_ = rc.do(Change{op, want.object()}, func() error { return r.h.NeighSet(want.spec()) })
		}
	}
}

// addRoutes writes every wanted route this network does not have exactly
// (a replace in place when it has one at the same destination and metric),
// unless someone else's route there would win: that is a conflict, and the
// foreign route stays.
func (r *Reconciler) addRoutes(rc *recorder, d desired, cur current) {
	for _, k := range sortedKeys(d.routes) {
		want := d.routes[k]
		op := OpAdd
		found := false
		for _, have := range cur.ownedByDst[k] {
			if have.obj.Priority == want.priority() {
				op = OpReplace
				found = found || want.matches(have.obj)
			}
		}
		if f, err := r.blocker(cur, want, op); f != nil || err != nil {
			c := Change{OpAdd, want.object()}
			if err == nil {
				err = conflictErr(c, f)
			} else {
				err = fmt.Errorf("%s: %w", c, err)
			}
			_ = rc.fail(c, err)
			continue
		}
		if !found {
			r.writeRoute(rc, Change{op, want.object()}, want)
		}
	}
}

// blocker is someone else's route at want's destination that the kernel
// would prefer to want, nil when there is none. A state read from the
// kernel knows; a blind one (Update's) asks the kernel, and only for a
// destination this network had no route at.
func (r *Reconciler) blocker(cur current, want route, op Op) (*netlink.Route, error) {
	switch {
	case !cur.blind:
		return cur.blocker(want), nil
	case op != OpAdd:
		return nil, nil
	}
	return r.blockerOf(cur, want)
}

// blockerOf is the route of someone else at want's destination the kernel
// would prefer to want, nil when there is none. One FIB lookup of the
// destination's address answers in the common cases: the best route is
// exactly at want's destination (then it is the one to compare with), or it
// is a shorter prefix of the main table, or there is none (then no usable
// route is at want's destination: it would be the longer match). Otherwise
// (a longer prefix inside want's, another table's route) the family's routes
// are dumped, once per pass (cur.dumps).
func (r *Reconciler) blockerOf(cur current, want route) (*netlink.Route, error) {
	got, err := r.h.RouteGetWithOptions(want.dst.IP, &netlink.RouteGetOptions{FIBMatch: true})
	if errors.Is(err, unix.ENETUNREACH) {
		return nil, nil
	}
	wantLen, _ := want.dst.Mask.Size()
	if err == nil && len(got) == 1 && got[0].Table == unix.RT_TABLE_MAIN {
		rt := got[0]
		gotLen := 0
		if rt.Dst != nil {
			gotLen, _ = rt.Dst.Mask.Size()
		}
		switch {
		case rt.Dst != nil && rt.Dst.String() == want.key():
			if rt.Priority < want.priority() || (rt.Priority == want.priority() && rt.Protocol != RouteProtocol) {
				return &rt, nil
			}
			return nil, nil
		case gotLen < wantLen:
			return nil, nil
		}
	}
	fam := family(want.dst.IP)
	routes, ok := cur.dumps[fam]
	if !ok {
		if routes, err = r.routeDump(fam); err != nil {
			return nil, err
		}
		if cur.dumps != nil {
			cur.dumps[fam] = routes
		}
	}
	for _, rt := range routes {
		if rt.Dst != nil && rt.Dst.String() == want.key() && rt.Priority <= want.priority() &&
			(rt.Protocol != RouteProtocol || rt.Priority != want.priority()) {
			return &rt, nil
		}
	}
	return nil, nil
}

// writeRoute writes want: a replace over a route of ours, an add with
// NLM_F_EXCL where the state had none. If one of ours is there after all
// (left by a peer held for a conflict, or made since the dump), the kernel
// says EEXIST and it is replaced.
func (r *Reconciler) writeRoute(rc *recorder, c Change, want route) {
	_ = rc.doAs(c, func(c *Change) error {
		if c.Op == OpAdd {
			err := r.h.RouteAdd(want.spec())
			if !errors.Is(err, unix.EEXIST) {
				return err
			}
			c.Op = OpReplace
		}
		return r.h.RouteReplace(want.spec())
	})
}

func (r *Reconciler) deleteRoutes(rc *recorder, d desired, cur current) {
	var unwanted []keyed[netlink.Route]
	for _, have := range cur.owned {
		if want, ok := d.routes[have.key]; ok && have.obj.Priority == want.priority() {
			continue // matched, or replaced in place above
		}
		if !d.held[objKey(KindRoute, have.key)] {
			unwanted = append(unwanted, have)
		}
	}
	for _, u := range inKeyOrder(unwanted) {
		have := u.obj
		c := Change{OpDelete, kernelRouteObject(have, cur.devs[have.LinkIndex])}
		_ = rc.do(c, func() error { return ignoreGone(r.h.RouteDel(&have)) })
	}
}

func (r *Reconciler) deleteNeighs(rc *recorder, d desired, cur current) {
	var unwanted []keyed[netlink.Neigh]
	for _, have := range cur.neighs {
		if _, ok := d.neighs[have.key]; !ok && !d.held[objKey(KindNeigh, have.key)] {
			unwanted = append(unwanted, have)
		}
	}
	for _, u := range inKeyOrder(unwanted) {
		have := u.obj
		c := Change{OpDelete, Object{Kind: KindNeigh, Desc: fmt.Sprintf("%s lladdr %s dev %s", have.IP, have.HardwareAddr, cur.devs[have.LinkIndex])}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.NeighDel(&have)) })
	}
}

// deleteFDBs removes every entry not wanted as it is, with its destination:
// for a MAC whose destination moved, the set above already moved the
// MAC's first destination (deleting the old one then finds nothing, which
// is success), and any further destination goes.
func (r *Reconciler) deleteFDBs(rc *recorder, d desired, cur current) {
	var unwanted []keyed[netlink.Neigh]
	for _, have := range cur.fdbs {
		if want, ok := d.fdbs[have.key]; !(ok && want.dst.Equal(have.obj.IP)) && !d.held[objKey(KindFDB, have.key)] {
			unwanted = append(unwanted, have)
		}
	}
	for _, u := range inKeyOrder(unwanted) {
		have := u.obj
		spec := fdbSpec(have.LinkIndex, have.HardwareAddr, have.IP)
		c := Change{OpDelete, Object{Kind: KindFDB, Desc: fmt.Sprintf("%s dst %s dev %s", have.HardwareAddr, have.IP, cur.devs[have.LinkIndex])}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.NeighDel(spec)) })
	}
}

// inKeyOrder sorts objects by key, whatever order the state listed them
// in; objects of one key keep theirs.
func inKeyOrder[T any](s []keyed[T]) []keyed[T] {
	slices.SortStableFunc(s, func(a, b keyed[T]) int { return strings.Compare(a.key, b.key) })
	return s
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
