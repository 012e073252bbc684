package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrNeedSet is returned by Update when it has no baseline to apply a change
// to: no Set since New (or since Teardown), a Set or Update whose writes
// failed, another self, or a closed reconciler. The caller runs Set with the
// full peer list instead; that also makes the next Update possible.
var ErrNeedSet = errors.New("overlay: no baseline for an incremental update; run Set with the full peer list")

// PeerChange is a known change to the peer set, such as a registry watch
// event reports. Peers are matched by Name.
type PeerChange struct {
	Added   []Node // peers new to the set
	Updated []Node // peers whose address, VTEP MAC or pod subnets changed (the new record)
	Removed []Node // peers gone; only Name is used
}

// baseline is what the last successful Set or Update made the kernel carry,
// kept so that Update can write a known change without reading the kernel.
type baseline struct {
	mode  Mode
	self  Node
	e     env
	out   outcome // device, underlay and MTU for the Report
	peers []Node
	d     desired
}

// Update applies a known change on top of the peer set of the last Set (or
// Update) without dumping routes, neighbours or FDB entries: it plans the
// whole new peer set in memory the way Set does (same backend choice per
// peer, same conflicts between peers and with self, same held objects for
// peers that cannot be planned), compares it with the previous plan, and
// writes only the difference: route replace, neighbour set, FDB set, and
// deletions of what the change made unwanted. The Report has the same shape
// as Set's. A peer in Removed that is unknown is ignored; a peer in Added that
// is already known is updated.
//
// What Update cannot see, because it reads nothing back: objects changed or
// removed by hand since the last Set (drift), a foreign route placed over one
// of this network's routes, and the underlay and VXLAN device themselves
// (taken as they were at the last Set: an underlay address change, or a
// deleted device, needs Set). A route at a new destination is added with
// NLM_F_EXCL, so a route of another protocol already there is never
// overwritten: it is reported as a conflict (ErrConflict), as Set does. The
// agent's periodic Set and Status (CHECK) still read everything and repair
// or report all of it.
//
// Update returns ErrNeedSet (and writes nothing) when there is no baseline;
// after a failed write the baseline is dropped, so the next Update returns
// ErrNeedSet until a Set succeeds.
func (r *Reconciler) Update(ctx context.Context, self Node, change PeerChange) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.base
	switch {
	case r.h == nil:
		return Report{}, fmt.Errorf("%w (%w)", ErrNeedSet, errClosed)
	case b == nil:
		return Report{}, ErrNeedSet
	case !sameNode(b.self, self):
		return Report{}, fmt.Errorf("%w: self changed from %v to %v", ErrNeedSet, describeNode(b.self), describeNode(self))
	}
	peers := applyChange(b.peers, change)
	d, problems := plan(backendFor(b.mode), b.e, self, peers)
	rc := &recorder{ctx: ctx}
	r.applyKnown(rc, b.d, d)
	rep := Report{Applied: rc.applied, Failed: append(problems, rc.failed...), Device: b.out.device, Underlay: b.out.underlay, MTU: b.out.mtu}
	if len(rc.failed) > 0 || rc.stopped != nil {
		r.base = nil
	} else {
		b.peers, b.d = peers, d
	}
	rc.failed = rep.Failed
	return rep, rc.err()
}

// keepBaseline records the outcome of a Set pass for Update, or forgets it
// when a write failed (then the kernel is not known to match the plan).
func (r *Reconciler) keepBaseline(rc *recorder, mode Mode, self Node, peers []Node, out outcome) {
	r.base = nil
	if len(rc.failed) > 0 || rc.stopped != nil || (mode != ModeNone && out.d.routes == nil) {
		return
	}
	r.base = &baseline{mode: mode, self: cloneNode(self), e: out.env, out: out, peers: clonePeers(peers), d: out.d}
}

// applyChange is peers with change applied: removals first, then additions
// and updates (replacing a peer of the same name).
func applyChange(peers []Node, c PeerChange) []Node {
	gone := map[string]bool{}
	for _, n := range c.Removed {
		gone[n.Name] = true
	}
	upsert := append(slices.Clone(c.Added), c.Updated...)
	for _, n := range upsert {
		gone[n.Name] = true
	}
	out := make([]Node, 0, len(peers)+len(upsert))
	for _, p := range peers {
		if !gone[p.Name] {
			out = append(out, p)
		}
	}
	return append(out, clonePeers(upsert)...)
}

// applyKnown brings the kernel from plan old (what it is believed to carry)
// to plan d, in Set's order: FDB, neighbours, routes, then the deletions.
func (r *Reconciler) applyKnown(rc *recorder, old, d desired) {
	for _, k := range sortedKeys(d.fdbs) {
		want := d.fdbs[k]
		have, ok := old.fdbs[k]
		if ok && have.dst.Equal(want.dst) && have.link.index == want.link.index {
			continue
		}
		_ = rc.do(Change{opFor(ok), want.object()}, func() error { return r.h.NeighSet(want.spec()) })
	}
	for _, k := range sortedKeys(d.neighs) {
		want := d.neighs[k]
		have, ok := old.neighs[k]
		if ok && bytes.Equal(have.mac, want.mac) && have.link.index == want.link.index {
			continue
		}
		_ = rc.do(Change{opFor(ok), want.object()}, func() error { return r.h.NeighSet(want.spec()) })
	}
	for _, k := range sortedKeys(d.routes) {
		want := d.routes[k]
		have, ok := old.routes[k]
		if ok && sameRoute(have, want) {
			continue
		}
		if ok {
			// Ours at the last Set or Update: replaced in place, as Set does.
			_ = rc.do(Change{OpReplace, want.object()}, func() error { return r.h.RouteReplace(want.spec()) })
			continue
		}
		r.addRoute(rc, want)
	}
	for _, k := range sortedKeys(old.routes) {
		have := old.routes[k]
		if _, ok := d.routes[k]; ok || d.held[objKey(KindRoute, k)] {
			continue
		}
		c := Change{OpDelete, Object{Kind: KindRoute, Desc: have.object().Desc}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.RouteDel(have.spec())) })
	}
	for _, k := range sortedKeys(old.neighs) {
		have := old.neighs[k]
		if _, ok := d.neighs[k]; ok || d.held[objKey(KindNeigh, k)] {
			continue
		}
		c := Change{OpDelete, Object{Kind: KindNeigh, Desc: have.object().Desc}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.NeighDel(have.spec())) })
	}
	for _, k := range sortedKeys(old.fdbs) {
		have := old.fdbs[k]
		if _, ok := d.fdbs[k]; ok || d.held[objKey(KindFDB, k)] {
			continue // still wanted: set in place above (a new dst replaces the old one)
		}
		c := Change{OpDelete, Object{Kind: KindFDB, Desc: have.object().Desc}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.NeighDel(have.spec())) })
	}
}

// addRoute adds a route at a destination this network had no route to.
// Someone else's route at that destination that the kernel would prefer
// (another protocol, or another Village network, with a metric no higher)
// is a conflict, as in Set, and is left alone; one dump of the family tells.
// NLM_F_EXCL never overwrites: a route of ours already in the slot (left
// over, e.g. by a peer held for a conflict) is replaced.
func (r *Reconciler) addRoute(rc *recorder, want route) {
	c := Change{OpAdd, want.object()}
	if rc.dry {
		_ = rc.do(c, nil)
		return
	}
	if f, err := r.blockerOf(want); err != nil || f != nil {
		if err == nil {
			err = conflictErr(c, f)
		}
		_ = rc.fail(c, fmt.Errorf("%s: %w", c, err))
		return
	}
	err := r.h.RouteAdd(want.spec())
	if err == nil || !errors.Is(err, unix.EEXIST) {
		_ = rc.do(c, func() error { return err })
		return
	}
	c.Op = OpReplace
	_ = rc.do(c, func() error { return r.h.RouteReplace(want.spec()) })
}

// blockerOf is the route of someone else at want's destination the kernel
// would prefer to want, nil when there is none. One FIB lookup answers when
// the best route for the destination's address is exactly at want's
// destination; otherwise the family's routes are dumped once.
func (r *Reconciler) blockerOf(want route) (*netlink.Route, error) {
	got, err := r.h.RouteGetWithOptions(want.dst.IP, &netlink.RouteGetOptions{FIBMatch: true})
	if err == nil && len(got) == 1 && got[0].Dst != nil && got[0].Dst.String() == want.key() && got[0].Table == unix.RT_TABLE_MAIN {
		if rt := got[0]; rt.Priority < want.priority() || (rt.Priority == want.priority() && rt.Protocol != RouteProtocol) {
			return &rt, nil
		}
		return nil, nil
	}
	routes, err := r.routeDump(family(want.dst.IP))
	if err != nil {
		return nil, err
	}
	for _, rt := range routes {
		if rt.Dst != nil && rt.Dst.String() == want.key() && rt.Priority <= want.priority() &&
			(rt.Protocol != RouteProtocol || rt.Priority != want.priority()) {
			return &rt, nil
		}
	}
	return nil, nil
}

func opFor(existed bool) Op {
	if existed {
		return OpReplace
	}
	return OpAdd
}

func sameRoute(a, b route) bool {
	return a.key() == b.key() && a.gw.Equal(b.gw) && a.link.index == b.link.index && a.onlink == b.onlink
}

func sameNode(a, b Node) bool {
	return a.Name == b.Name && a.IP.Equal(b.IP) && bytes.Equal(a.VtepMAC, b.VtepMAC) && fmt.Sprint(a.PodCIDRs) == fmt.Sprint(b.PodCIDRs)
}

func describeNode(n Node) string { return fmt.Sprintf("%s %s %v", n.Name, n.IP, n.PodCIDRs) }

func cloneNode(n Node) Node {
	n.IP = slices.Clone(n.IP)
	n.VtepMAC = slices.Clone(n.VtepMAC)
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

func clonePeers(peers []Node) []Node {
	out := make([]Node, len(peers))
	for i, p := range peers {
		out[i] = cloneNode(p)
	}
	return out
}
