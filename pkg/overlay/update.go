package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
)

// ErrNeedSet is returned by Update when it has no baseline to apply a change
// to: no Set since New (or since Teardown), a Set or Update whose writes
// failed, another self, a Set given two peers of one name, a closed
// reconciler, or (auto) a change that makes the VXLAN device needed or no
// longer needed. The caller runs Set with the full peer list instead; that
// also makes the next Update possible.
var ErrNeedSet = errors.New("overlay: no baseline for an incremental update; run Set with the full peer list")

// PeerChange is a known change to the peer set, such as a registry watch
// event reports. Peers are matched by Name.
type PeerChange struct {
	Added   []Node // peers new to the set
	Updated []Node // peers whose address, VTEP MAC or pod subnets changed (the new record)
	Removed []Node // peers gone; only Name is used
}

// Empty reports whether c changes nothing.
func (c PeerChange) Empty() bool { return len(c.Added)+len(c.Updated)+len(c.Removed) == 0 }

// Diff is the change from the peer set before to the peer set after, by
// name: this package's one comparison of peers (the agent diffs the
// registry's snapshots with it and hands the result to Update). Added and
// Updated hold after's records, Removed before's, each in name order.
func Diff(before, after []Node) PeerChange {
	var ch PeerChange
	was := make(map[string]Node, len(before))
	for _, p := range before {
		was[p.Name] = p
	}
	for _, p := range after {
		old, ok := was[p.Name]
		switch {
		case !ok:
			ch.Added = append(ch.Added, p)
		case !sameNode(old, p):
			ch.Updated = append(ch.Updated, p)
		}
		delete(was, p.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(was)) {
		ch.Removed = append(ch.Removed, was[name])
	}
	byName := func(a, b Node) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(ch.Added, byName)
	slices.SortFunc(ch.Updated, byName)
	return ch
}

// baseline is what the last successful Set or Update made the kernel carry,
// kept so that Update can write a known change without reading the kernel.
type baseline struct {
	mode  Mode
	self  Node
	e     env
	out   outcome // device, underlay and MTU for the Report
	peers map[string]Node
	d     desired
	// byPeer lists the objKeys of each peer's planned objects, so a change
	// of one peer finds what it had without going through every object.
	byPeer map[string][]objRef
	// clean: the plan had no problem (no conflict, nothing held), so a
	// change whose own objects collide with no other peer's can be planned
	// on its own (see Update).
	clean bool
}

// Update applies a known change on top of the peer set of the last Set (or
// Update) without dumping routes, neighbours or FDB entries, and without
// going through the peers the change does not name: it plans only the
// changed peers (the same backend choice per peer as Set), and when their
// objects collide with no other peer's, with self or with each other, the
// result is exactly what Set's plan of the whole new set would be, so Set's
// engine (apply) is handed only those peers' new objects against their old
// ones (believed), and writes only the difference: route replace, neighbour
// set, FDB set, and deletions of what the change made unwanted, additions
// before deletions. When they do collide, or the last plan had a problem
// (a conflict, a peer held), the whole new set is planned in memory as Set
// does (same conflicts, resolved in the same order, same held objects) and
// applied against the whole last plan. The Report has the same shape as
// Set's. A peer in Removed that is unknown is ignored; a peer in Added that
// is already known is updated.
//
// What Update cannot see, because it reads nothing back: objects changed or
// removed by hand since the last Set (drift), a foreign route placed over one
// of this network's routes, and the underlay and VXLAN device themselves
// (taken as they were at the last Set: an underlay address change, or a
// deleted device, needs Set). Before a route is added at a new destination
// the kernel is asked whether someone else's route there would win
// (blockerOf): such a route is never overwritten but reported as a conflict
// (ErrConflict), as Set does. The agent's periodic Set and Status (CHECK)
// still read everything and repair or report all of it.
//
// Update returns ErrNeedSet (and writes nothing) when there is no baseline;
// after a failed write the baseline is dropped, so the next Update returns
// ErrNeedSet until a Set succeeds.
func (r *Reconciler) Update(ctx context.Context, self Node, change PeerChange) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.usableBase()
	switch {
	case err != nil:
		return Report{}, err
	case !sameNode(b.self, self):
		return Report{}, fmt.Errorf("%w: self changed from %v to %v", ErrNeedSet, describeNode(b.self), describeNode(self))
	case b.mode == ModeWireGuard:
		return Report{}, fmt.Errorf("%w: under wireguard every peer change also sets the device's peer list", ErrNeedSet)
	}
	touched := touchedBy(change)
	rc := &recorder{ctx: ctx}
	var problems []Failure
	if nd, ok := b.planDelta(touched); ok {
		if err := r.autoDeviceStays(b, len(nd.fdbs) > 0 || b.untouchedFDB(touched)); err != nil {
			return Report{}, err
		}
		r.apply(rc, nd, believed(b.objectsOf(touched)))
		if len(rc.failed) == 0 && rc.stopped == nil {
			b.commitDelta(touched, nd)
		}
	} else {
		peers := maps.Clone(b.peers)
		for name, n := range touched {
			delete(peers, name)
			if n != nil {
				peers[name] = *n
			}
		}
		var d desired
		d, problems = plan(backendFor(b.mode), b.e, self, slices.Collect(maps.Values(peers)))
		if err := r.autoDeviceStays(b, len(d.fdbs) > 0); err != nil {
			return Report{}, err
		}
		r.apply(rc, d, believed(b.d))
		if len(rc.failed) == 0 && rc.stopped == nil {
			b.reset(peers, d, problems)
		}
	}
	rep := Report{Applied: rc.applied, Failed: append(problems, rc.failed...), Device: b.out.device, Underlay: b.out.underlay, MTU: b.out.mtu}
	if len(rc.failed) > 0 || rc.stopped != nil {
		r.base = nil
	}
	rc.failed = rep.Failed
	return rep, rc.err()
}

// usableBase is the baseline an incremental write (Update, Repair) starts
// from, or ErrNeedSet when there is none (never a Set since New or
// Teardown, a failed write since, a closed reconciler).
func (r *Reconciler) usableBase() (*baseline, error) {
	switch {
	case r.h == nil:
		return nil, fmt.Errorf("%w (%w)", ErrNeedSet, errClosed)
	case r.base == nil:
		return nil, ErrNeedSet
	}
	return r.base, nil
}

// autoDeviceStays refuses an Update under auto whose new peer set needs the
// VXLAN device made (its first VXLAN peer) or removed (its last one): that
// is Set's job.
func (r *Reconciler) autoDeviceStays(b *baseline, need bool) error {
	have := b.e.vtep.index != 0
	if b.mode != ModeAuto || need == have {
		return nil
	}
	what := "made"
	if have {
		what = "removed"
	}
	return fmt.Errorf("%w: auto: the VXLAN device %s is to be %s", ErrNeedSet, r.Device(), what)
}

// untouchedFDB tells whether a peer the change does not name keeps an FDB
// entry (so still needs the VXLAN device).
func (b *baseline) untouchedFDB(touched map[string]*Node) bool {
	for _, f := range b.d.fdbs {
		if _, ok := touched[f.peer]; !ok {
			return true
		}
	}
	return false
}

// touchedBy is every peer the change names, with its new record (nil when
// it is removed): removals first, then additions and updates, so a name
// both removed and added is added.
func touchedBy(c PeerChange) map[string]*Node {
	out := make(map[string]*Node, len(c.Added)+len(c.Updated)+len(c.Removed))
	for _, n := range c.Removed {
		out[n.Name] = nil
	}
	for _, n := range append(slices.Clone(c.Added), c.Updated...) {
		n = cloneNode(n)
		out[n.Name] = &n
	}
	return out
}

// planDelta plans the touched peers' new records alone; ok is false when
// that is not the plan of the whole new set restricted to them: the last
// plan was not clean, a touched peer cannot be planned, or one of its
// objects is under a key an untouched peer holds.
func (b *baseline) planDelta(touched map[string]*Node) (desired, bool) {
	if !b.clean {
		return desired{}, false
	}
	ups := make([]Node, 0, len(touched))
	for _, n := range touched {
		if n != nil {
			ups = append(ups, *n)
		}
	}
	d, problems := plan(backendFor(b.mode), b.e, b.self, ups)
	if len(problems) > 0 {
		return d, false
	}
	untouched := func(peer string) bool { _, ok := touched[peer]; return !ok }
	for k := range d.routes {
		if o, ok := b.d.routes[k]; ok && untouched(o.peer) {
			return d, false
		}
	}
	for k := range d.neighs {
		if o, ok := b.d.neighs[k]; ok && untouched(o.peer) {
			return d, false
		}
	}
	for k := range d.fdbs {
		if o, ok := b.d.fdbs[k]; ok && untouched(o.peer) {
			return d, false
		}
	}
	return d, true
}

// objectsOf is the part of the last plan that serves the touched peers.
func (b *baseline) objectsOf(touched map[string]*Node) desired {
	d := desired{routes: map[string]route{}, neighs: map[string]neigh{}, fdbs: map[string]fdb{}, held: map[string]bool{}}
	for name := range touched {
		for _, k := range b.byPeer[name] {
			switch k.kind {
			case KindRoute:
				d.routes[k.key] = b.d.routes[k.key]
			case KindNeigh:
				d.neighs[k.key] = b.d.neighs[k.key]
			case KindFDB:
				d.fdbs[k.key] = b.d.fdbs[k.key]
			}
		}
	}
	return d
}

// commitDelta makes the baseline say what the kernel carries after the
// touched peers' objects were replaced by nd.
func (b *baseline) commitDelta(touched map[string]*Node, nd desired) {
	for name, n := range touched {
		for _, k := range b.byPeer[name] {
			switch k.kind {
			case KindRoute:
				delete(b.d.routes, k.key)
			case KindNeigh:
				delete(b.d.neighs, k.key)
			case KindFDB:
				delete(b.d.fdbs, k.key)
			}
		}
		delete(b.byPeer, name)
		delete(b.peers, name)
		if n != nil {
			b.peers[name] = *n
		}
	}
	for k, rt := range nd.routes {
		b.d.routes[k] = rt
	}
	for k, n := range nd.neighs {
		b.d.neighs[k] = n
	}
	for k, f := range nd.fdbs {
		b.d.fdbs[k] = f
	}
	b.index(nd)
}

// reset makes the baseline the plan d of peers.
func (b *baseline) reset(peers map[string]Node, d desired, problems []Failure) {
	b.peers, b.d = peers, d
	b.clean = len(problems) == 0 && len(d.held) == 0
	b.byPeer = make(map[string][]objRef, len(peers))
	b.index(d)
}

// objRef names one planned object: its kind and key.
type objRef struct {
	kind Kind
	key  string
}

// index adds d's objects to byPeer.
func (b *baseline) index(d desired) {
	for k, rt := range d.routes {
		b.byPeer[rt.peer] = append(b.byPeer[rt.peer], objRef{KindRoute, k})
	}
	for k, n := range d.neighs {
		b.byPeer[n.peer] = append(b.byPeer[n.peer], objRef{KindNeigh, k})
	}
	for k, f := range d.fdbs {
		b.byPeer[f.peer] = append(b.byPeer[f.peer], objRef{KindFDB, k})
	}
}

// keepBaseline records the outcome of a Set pass for Update, or forgets it
// when a write failed (then the kernel is not known to match the plan) or
// the list named a peer twice (the baseline keeps peers by name).
func (r *Reconciler) keepBaseline(rc *recorder, mode Mode, self Node, peers []Node, out outcome) {
	b := r.base
	r.base = nil
	if len(rc.failed) > 0 || rc.stopped != nil || (mode != ModeNone && out.d.routes == nil) {
		return
	}
	if out.again && b != nil {
		b.out = out // the same plan: only the device's MTU may have moved
		r.base = b
		return
	}
	byName := make(map[string]Node, len(peers))
	for _, p := range peers {
		if _, twice := byName[p.Name]; twice {
			return
		}
		byName[p.Name] = cloneNode(p)
	}
	b = &baseline{mode: mode, self: cloneNode(self), e: out.env, out: out}
	b.reset(byName, out.d, out.problems)
	r.base = b
}

// sameNode reports whether two records say the same node.
func sameNode(a, b Node) bool {
	return a.Name == b.Name && a.IP.Equal(b.IP) && bytes.Equal(a.VtepMAC, b.VtepMAC) &&
		slices.EqualFunc(a.PodCIDRs, b.PodCIDRs, sameNetOrNil) &&
		a.WireGuardKey == b.WireGuardKey && sameUDPAddr(a.WireGuardEndpoint, b.WireGuardEndpoint) && a.WireGuardHub == b.WireGuardHub
}

func sameUDPAddr(a, b *net.UDPAddr) bool {
	return a == b || (a != nil && b != nil && a.IP.Equal(b.IP) && a.Port == b.Port && a.Zone == b.Zone)
}

func describeNode(n Node) string { return fmt.Sprintf("%s %s %v", n.Name, n.IP, n.PodCIDRs) }

func cloneNode(n Node) Node {
	n.IP = slices.Clone(n.IP)
	n.VtepMAC = slices.Clone(n.VtepMAC)
	if n.WireGuardEndpoint != nil {
		ep := *n.WireGuardEndpoint
		ep.IP = slices.Clone(ep.IP)
		n.WireGuardEndpoint = &ep
	}
	cidrs := make([]*net.IPNet, 0, len(n.PodCIDRs))
	for _, c := range n.PodCIDRs {
		if c != nil {
			cc := *c
			cc.IP, cc.Mask = slices.Clone(c.IP), slices.Clone(c.Mask)
			c = &cc
		}
		cidrs = append(cidrs, c)
	}
	n.PodCIDRs = cidrs
	return n
}
