package overlay

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Repair puts right the objects the kernel events evs are about, each
// against the plan of the last successful Set or Update, without planning
// the peers again and without reading the kernel back: the events say what
// the kernel now has under each key (the last one of a key wins), the plan
// says what it should have, and Set's engine (apply) writes the
// difference. A planned route, neighbour or FDB entry deleted is added
// back, one changed is rewritten, one of this network's that the plan does
// not have (a stray) is deleted; adding a route asks the kernel whether
// someone else's route there would win, as Update does. The kernel then
// carries what a Set of the same peers would leave (see
// TestRepairMatchesSet).
//
// Repair answers ErrNeedSet, writing nothing, to what one object cannot
// say: no baseline, or one with problems or held objects; an event about a
// link or an address (the VXLAN device deleted or set down, the underlay
// changed); a default route; a route of someone else (in front of a
// planned one, or deleted while a peer was held) or of before the metrics;
// an entry on another device. The caller runs Set then. The first failed
// write stops the rest (the Set that must follow writes them) and drops
// the baseline, as after a failed Update; when it failed because the
// VXLAN device is gone, the answer is ErrDeviceGone and the baseline
// stays for RepairDevice.
func (r *Reconciler) Repair(ctx context.Context, evs []KernelEvent) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.usableBase()
	switch {
	case err != nil:
		return Report{}, err
	case !b.clean:
		return Report{}, fmt.Errorf("%w: the last plan had problems or held objects", ErrNeedSet)
	}
	seen, err := b.eventState(evs, r.metric)
	if err != nil {
		return Report{}, err
	}
	d, cur := seen.restrict(b)
	rc := &recorder{ctx: ctx, once: true}
	r.apply(rc, d, cur)
	rep := Report{Applied: rc.applied, Failed: rc.failed, Device: b.out.device, Underlay: b.out.underlay, MTU: b.out.mtu}
	if len(rc.failed) == 0 && rc.stopped == nil {
		return rep, nil
	}
	if r.vtepGone(b, rc.failed) {
		// The baseline stays for RepairDevice, which drops it.
		return rep, fmt.Errorf("%w: %w", ErrDeviceGone, rc.err())
	}
	r.base = nil
	return rep, rc.err()
}

// ErrDeviceGone is Repair's answer when its writes failed because the
// VXLAN device is gone: a notification of one of the device's entries
// comes first when the device is deleted (the kernel flushes its FDB, one
// notification an entry, before it closes and removes it), and a repair
// of those entries waits for the removal to finish and then finds no
// device. It wraps ErrNeedSet; the caller makes the device first
// (RepairDevice, for which the baseline is kept), then runs Set.
var ErrDeviceGone = fmt.Errorf("%w: the VXLAN device is gone", ErrNeedSet)

// vtepGone reports whether a failed write of Repair's found the plan's
// VXLAN device gone: it failed for want of a device (ENODEV), and the
// kernel has no link at the device's index now, or another one there.
func (r *Reconciler) vtepGone(b *baseline, failed []Failure) bool {
	if b.e.vtep.index == 0 || !slices.ContainsFunc(failed, func(f Failure) bool { return errors.Is(f.Err, unix.ENODEV) }) {
		return false
	}
	l, err := r.h.LinkByIndex(b.e.vtep.index)
	return linkNotFound(err) || (err == nil && l.Attrs().Name != b.e.vtep.name)
}

// seenState is what a batch of events says the kernel has under each key
// they name: nil for nothing (deleted, or an entry a pass does not read).
type seenState struct {
	routes map[string]*netlink.Route            // this network's route, by destination
	neighs map[string]*netlink.Neigh            // the VXLAN device's entry, by address
	fdbs   map[string]map[string]*netlink.Neigh // the VXLAN device's entries, by MAC, then destination
}

// eventState folds evs, in order, into what the kernel has under each key;
// an event Repair cannot judge alone is ErrNeedSet.
func (b *baseline) eventState(evs []KernelEvent, metric int) (seenState, error) {
	s := seenState{routes: map[string]*netlink.Route{}, neighs: map[string]*netlink.Neigh{}, fdbs: map[string]map[string]*netlink.Neigh{}}
	for _, ev := range evs {
		switch {
		case ev.LinkIndex != 0 || ev.Addr != nil:
			return s, fmt.Errorf("%w: a link or address changed (link %d)", ErrNeedSet, ev.LinkIndex)
		case ev.Route != nil:
			k := ev.Route
			switch {
			case k.Dst == nil || k.Dst.IP.IsUnspecified():
				return s, fmt.Errorf("%w: a default route changed", ErrNeedSet)
			case k.Table != unix.RT_TABLE_MAIN && k.Table != 0:
				continue // a pass reads the main table only
			case k.Protocol != RouteProtocol || k.Priority != metric:
				return s, fmt.Errorf("%w: route %s of protocol %s, metric %d", ErrNeedSet, k.Dst, k.Protocol, k.Priority)
			}
			key := canonical(k.Dst).String()
			if ev.Deleted {
				s.routes[key] = nil
			} else {
				rt := *k
				s.routes[key] = &rt
			}
		case ev.Neigh != nil:
			n := ev.Neigh
			if !b.onVTEP(n.LinkIndex) {
				return s, fmt.Errorf("%w: an entry on link %d, not the VXLAN device", ErrNeedSet, n.LinkIndex)
			}
			var have *netlink.Neigh
			if !ev.Deleted && vtepEntry(n) {
				nn := *n
				have = &nn
			}
			if n.Family == unix.AF_BRIDGE {
				mac := n.HardwareAddr.String()
				if s.fdbs[mac] == nil {
					s.fdbs[mac] = map[string]*netlink.Neigh{}
				}
				s.fdbs[mac][n.IP.String()] = have
			} else {
				s.neighs[n.IP.String()] = have
			}
		}
	}
	return s, nil
}

// restrict is the plan and the kernel state of only the keys s names: the
// plan's objects under them, and what the events say is there.
func (s seenState) restrict(b *baseline) (desired, current) {
	d := desired{routes: map[string]route{}, neighs: map[string]neigh{}, fdbs: map[string]fdb{}, held: map[string]bool{}}
	cur := current{blind: true, devs: map[int]string{}, dumps: map[int][]netlink.Route{}}
	if b.e.vtep.index != 0 {
		cur.devs[b.e.vtep.index] = b.e.vtep.name
	}
	if u := b.e.u.link; u != nil {
		cur.devs[u.Attrs().Index] = u.Attrs().Name
	}
	for k, have := range s.routes {
		if want, ok := b.d.routes[k]; ok {
			d.routes[k] = want
		}
		if have != nil {
			cur.owned = append(cur.owned, keyed[netlink.Route]{k, *have})
		}
	}
	for k, have := range s.neighs {
		if want, ok := b.d.neighs[k]; ok {
			d.neighs[k] = want
		}
		if have != nil {
			cur.neighs = append(cur.neighs, keyed[netlink.Neigh]{k, *have})
		}
	}
	for mac, dsts := range s.fdbs {
		if want, ok := b.d.fdbs[mac]; ok {
			d.fdbs[mac] = want
		}
		for _, have := range dsts {
			if have != nil {
				cur.fdbs = append(cur.fdbs, keyed[netlink.Neigh]{mac, *have})
			}
		}
	}
	for _, rt := range cur.owned {
		if _, ok := cur.devs[rt.obj.LinkIndex]; !ok {
			cur.devs[rt.obj.LinkIndex] = fmt.Sprintf("if%d", rt.obj.LinkIndex)
		}
	}
	cur.index()
	return d, cur
}

// RepairDevice makes the last successful pass's VXLAN device again, first
// and alone, when it is gone or other than that pass left it (deleted,
// set down): the device a full Set would make first too, without waiting
// for the plan and the dumps of every peer, which the Set that must follow
// (Repair cannot put back what went with the device) then does. Any change
// drops the baseline: its plan names the old device, or believes in routes
// the kernel dropped with the device's state, so Repair and Update answer
// ErrNeedSet until that Set. Nothing is done without a baseline, or one
// without the device.
func (r *Reconciler) RepairDevice(ctx context.Context) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.base
	if r.h == nil || b == nil || b.e.vtep.index == 0 || b.e.u.link == nil {
		return Report{}, nil
	}
	s := r.vtepSpecFor(b.e.u, b.self)
	rc := &recorder{ctx: ctx}
	ref := r.ensureVTEP(rc, s)
	if len(rc.failed) > 0 {
		// The first notification of a deletion is the device going down,
		// while the kernel is still removing it: the fix found it there
		// and failed once it was gone. Now it is gone: make it.
		if _, err := r.h.LinkByName(s.name); linkNotFound(err) {
			again := &recorder{ctx: ctx, applied: rc.applied}
			ref, rc = r.ensureVTEP(again, s), again
		}
	}
	if ref.index != b.e.vtep.index || len(rc.applied) > 0 || len(rc.failed) > 0 {
		r.base = nil
	}
	return Report{Applied: rc.applied, Failed: rc.failed, Device: b.out.device}, rc.err()
}
