package overlay

import (
	"context"
	"errors"
	"slices"

	"github.com/vishvananda/netlink"
)

var errClosed = errors.New("overlay: reconciler is closed")

// outcome is what one pass found besides the changes.
type outcome struct {
	device   string
	underlay string
	mtu      int
	problems []Failure
	env      env     // what the plan was made against (for Update)
	d        desired // the plan (for Update)
	again    bool    // d is the baseline's: the same inputs as its plan
}

// Set makes the kernel carry traffic to exactly these peers: it computes the
// desired objects, diffs them against the kernel (one dump per kind) and
// applies only the difference, additions before deletions. Repeating it with
// the same arguments writes nothing. self is this node: its IP (nil = the
// underlay's first global address) is the VXLAN local address, its pod
// subnets give the VTEP addresses. A peer with self's name or IP is skipped,
// so a registry's full node list can be passed as is.
//
// On error the Report still says what was applied and what failed; the
// error joins one %w-wrapped error per failure, each naming its object.
func (r *Reconciler) Set(ctx context.Context, self Node, peers []Node) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := &recorder{ctx: ctx}
	out, err := r.reconcile(rc, r.cfg.Mode, self, peers)
	if err != nil {
		r.base = nil
	} else {
		r.keepBaseline(rc, r.cfg.Mode, self, peers, out)
	}
	rc.failed = append(out.problems, rc.failed...)
	rep := Report{Applied: rc.applied, Failed: rc.failed, Device: out.device, Underlay: out.underlay, MTU: out.mtu}
	if err != nil {
		return rep, err
	}
	return rep, rc.err()
}

// Status reports, without writing anything, the changes Set(ctx, self,
// peers) would make now (drift), and the peers it could not plan.
func (r *Reconciler) Status(ctx context.Context, self Node, peers []Node) (Drift, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := &recorder{ctx: ctx, dry: true}
	out, err := r.reconcile(rc, r.cfg.Mode, self, peers)
	d := Drift{Changes: rc.applied, Problems: append(out.problems, rc.failed...), Device: out.device, Underlay: out.underlay, MTU: out.mtu}
	if err == nil {
		err = rc.stopped
	}
	return d, err
}

// Teardown removes everything this network owns: its routes and its VXLAN
// device (with the device go its addresses, neighbour and FDB entries).
// Routes of other protocols, and other networks' devices, stay.
func (r *Reconciler) Teardown(ctx context.Context) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := &recorder{ctx: ctx}
	r.base = nil
	_, err := r.reconcile(rc, ModeNone, Node{}, nil)
	rep := Report{Applied: rc.applied, Failed: rc.failed}
	if err != nil {
		return rep, err
	}
	return rep, rc.err()
}

// reconcile is the one pass Set, Status and Teardown share. The returned
// error is for what stops the pass (no underlay, a failed dump); failures of
// single objects are in rc.
func (r *Reconciler) reconcile(rc *recorder, mode Mode, self Node, peers []Node) (outcome, error) {
	if r.h == nil {
		return outcome{}, errClosed
	}
	if mode == ModeNone {
		d, _ := plan(nil, env{metric: r.metric}, self, peers)
		return outcome{d: d}, r.sweep(rc)
	}
	u, err := r.resolveUnderlay(self)
	if err != nil {
		return outcome{}, err
	}
	out := outcome{underlay: u.name(), mtu: u.mtu()}
	e := env{u: u, metric: r.metric}
	needsVTEP := needsDevice(mode, e, self, peers)
	if needsVTEP {
		if _, _, err := r.ownVTEP(); err != nil {
			return out, err
		}
		spec := r.vtepSpecFor(u, self)
		e.vtep = r.ensureVTEP(rc, spec)
		out.device, out.mtu = spec.name, spec.mtu
	}
	if mode == ModeWireGuard {
		e.wg = r.ensureWG(rc, u, self)
		out.device, out.mtu = e.wg.name, u.mtu()-WireGuardOverhead(u.ip)
	}
	d, problems, again := r.planFor(mode, e, self, peers)
	out.problems, out.env, out.d, out.again = problems, e, d, again
	if mode == ModeWireGuard {
		// Peers before routes: a new route's traffic finds its peer.
		r.setWGPeers(rc, e.wg, d, self, peers)
	}
	o, err := r.observe(e.vtep, d, linkRef{index: u.link.Attrs().Index, name: u.name()}, e.wg)
	if err != nil {
		return out, err
	}
	r.apply(rc, d, o)
	if !needsVTEP {
		r.removeVTEP(rc)
	}
	return out, nil
}

// planFor is plan(mode's backend, e, self, peers), or the baseline's plan
// when that was made for exactly these (a periodic pass, a CHECK, with
// nothing changed since the last Set or Update): at 5,000 peers planning
// again is a quarter of a pass's allocations (docs/performance.md, "The
// periodic pass at 5,000 peers"). Only a clean baseline is reused: one with
// problems or held objects does not keep its problems for the Report.
func (r *Reconciler) planFor(mode Mode, e env, self Node, peers []Node) (desired, []Failure, bool) {
	if b := r.base; b != nil && b.clean && b.mode == mode && sameNode(b.self, self) && sameEnv(b.e, e) && samePeers(b.peers, peers) {
		return b.d, nil, true
	}
	d, problems := plan(backendFor(mode), e, self, peers)
	return d, problems, false
}

// sameEnv reports whether a plan made in a is the plan made in b: the same
// underlay link, local address and subnets, VXLAN device and metric
// (everything of env a backend reads).
func sameEnv(a, b env) bool {
	if a.vtep != b.vtep || a.wg != b.wg || a.metric != b.metric || !a.u.ip.Equal(b.u.ip) || (a.u.link == nil) != (b.u.link == nil) {
		return false
	}
	if a.u.link != nil && (a.u.link.Attrs().Index != b.u.link.Attrs().Index || a.u.name() != b.u.name()) {
		return false
	}
	return slices.EqualFunc(a.u.addrs, b.u.addrs, func(x, y netlink.Addr) bool {
		return sameNetOrNil(x.IPNet, y.IPNet) && sameNetOrNil(x.Peer, y.Peer)
	})
}

// samePeers reports whether peers is exactly the records of have, each
// name once.
func samePeers(have map[string]Node, peers []Node) bool {
	if len(have) != len(peers) {
		return false
	}
	seen := make(map[string]struct{}, len(peers))
	for _, p := range peers {
		if h, ok := have[p.Name]; !ok || !sameNode(h, p) {
			return false
		}
		seen[p.Name] = struct{}{}
	}
	return len(seen) == len(have)
}

// sweep deletes every route of this network and its VXLAN device.
func (r *Reconciler) sweep(rc *recorder) error {
	var vtep linkRef
	if link, mine, _ := r.ownVTEP(); mine {
		vtep = linkRef{index: link.Attrs().Index, name: link.Attrs().Name}
	}
	o, err := r.observe(vtep, desired{})
	if err != nil {
		return err
	}
	r.apply(rc, desired{}, o)
	r.removeVTEP(rc)
	if r.cfg.Mode == ModeWireGuard {
		r.removeWG(rc)
	}
	return nil
}

// needsDevice says whether a pass in mode makes (or keeps) the VXLAN
// device: vxlan always; auto only while at least one peer subnet it can
// plan goes over VXLAN (off the underlay's subnets, or of the other address
// family), found by planning once without the device, which only names it
// in the objects. host-gw never. So auto on one L2 segment has no device,
// and pods get the underlay's MTU (see PodMTU for what a pod added before
// an off-link peer joins keeps).
func needsDevice(mode Mode, e env, self Node, peers []Node) bool {
	switch mode {
	case ModeVXLAN:
		return true
	case ModeAuto:
		d, _ := plan(autoBackend{}, e, self, peers)
		return len(d.fdbs) > 0
	}
	return false
}
