package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
)

// ErrNeedSet is returned by Update when it has no baseline to apply a change
// to: no Set since New (or since Teardown), a Set or Update whose writes
// failed, another self, a closed reconciler, or (auto) a change that makes
// the VXLAN device needed or no longer needed. The caller runs Set with the
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
// peers that cannot be planned), and hands it to Set's engine (apply) with
// the previous plan as what the kernel carries (believed), so only the
// difference is written: route replace, neighbour set, FDB set, and
// deletions of what the change made unwanted. The Report has the same shape
// as Set's. A peer in Removed that is unknown is ignored; a peer in Added that
// is already known is updated.
//
// What Update cannot see, because it reads nothing back: objects changed or
// removed by hand since the last Set (drift), a foreign route placed over one
// of this network's routes, and the underlay and VXLAN device themselves
// (taken as they were at the last Set: an underlay address change, or a
// deleted device, needs Set). Before a route is added at a new destination
// the kernel is asked whether someone else's route there would win
// (blockerOf): such a route is never overwritten but reported as a conflict
// (ErrConflict), as Set does. The
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
	if need, have := len(d.fdbs) > 0, b.e.vtep.index != 0; b.mode == ModeAuto && need != have {
		// auto's first VXLAN peer needs the device made, the last one's
		// departure needs it removed: Set's job.
		what := "made"
		if have {
			what = "removed"
		}
		return Report{}, fmt.Errorf("%w: auto: the VXLAN device %s is to be %s", ErrNeedSet, r.Device(), what)
	}
	rc := &recorder{ctx: ctx}
	r.apply(rc, d, believed(b.d))
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
