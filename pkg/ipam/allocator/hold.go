package allocator

// Sticky addresses (ipam "sticky"): when a Kubernetes pod's attachment is
// released, its address is not freed but held for the pod's identity
// (namespace/name) until the grace period ends, so the same pod coming
// back, on any node sharing the pool, gets it again. A hold is an ordinary
// allocation whose owner encodes the identity and the end of the grace
// period, so every store keeps it the same way and the policy lives here
// alone:
//
//	ContainerID "village-hold_<namespace>_<name>"  (neither name may hold '_')
//	IfName      "<end of the hold, Unix seconds>"
//
// While a hold lasts no other pod is given its address, except when the range
// set would otherwise be exhausted: then the hold closest to its end is
// given up (a sticky address is a best effort; an address a pod must have is
// a fixed one, CNI_ARGS IP / the lan-ip annotation). Expired holds are
// reclaimed when an ADD of a sticky network lists them, when a range set is
// full, when a fixed address asked for is held, and by GC.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/village-cni/village/pkg/ipam/store"
)

// Pod is a Kubernetes pod's identity, from CNI_ARGS K8S_POD_NAMESPACE and
// K8S_POD_NAME.
type Pod struct {
	Namespace, Name string
}

// IsSet reports whether both names are known.
func (p Pod) IsSet() bool { return p.Namespace != "" && p.Name != "" }

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// holdPrefix starts the ContainerID of a hold; runtimes' container IDs are
// hex digits, so none collides with it.
const holdPrefix = "village-hold_"

// Hold is an address held for a departed pod.
type Hold struct {
	IP    netip.Addr
	Pod   Pod
	Until time.Time
	owner store.Owner
}

func holdOwner(p Pod, until time.Time) store.Owner {
	return store.Owner{ContainerID: holdPrefix + p.Namespace + "_" + p.Name, IfName: strconv.FormatInt(until.Unix(), 10)}
}

// parseHold reads a hold's owner; ok is false for any other owner.
func parseHold(o store.Owner) (p Pod, until time.Time, ok bool) {
	rest, found := strings.CutPrefix(o.ContainerID, holdPrefix)
	if !found {
		return Pod{}, time.Time{}, false
	}
	ns, name, found := strings.Cut(rest, "_")
	secs, err := strconv.ParseInt(o.IfName, 10, 64)
	if !found || ns == "" || name == "" || err != nil {
		return Pod{}, time.Time{}, false
	}
	return Pod{Namespace: ns, Name: name}, time.Unix(secs, 0), true
}

func (a *Allocator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Allocator) sticky(p Pod) bool { return a.Sticky > 0 && p.IsSet() }

// Holds lists the network's holds, ordered by address.
func (a *Allocator) Holds(ctx context.Context) ([]Hold, error) {
	all, err := a.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the allocations of network %q: %w", a.Network, err)
	}
	var out []Hold
	for _, al := range all {
		if p, until, ok := parseHold(al.Owner); ok {
			out = append(out, Hold{IP: al.IP.Unmap(), Pod: p, Until: until, owner: al.Owner})
		}
	}
	return out, nil
}

func (a *Allocator) expired(h Hold) bool { return !a.now().Before(h.Until) }

// setOf returns the index of the range set holding ip, or -1.
func (a *Allocator) setOf(ip netip.Addr) int {
	for i, s := range a.RangeSets {
		if r := s.RangeFor(ip); r >= 0 && s[r].Allocatable(ip) {
			return i
		}
	}
	return -1
}

// ownHolds reclaims every expired hold and returns, per range set, the
// live hold of pod (the latest ending one; older ones are released).
func (a *Allocator) ownHolds(ctx context.Context, pod Pod) ([]Hold, error) {
	holds, err := a.Holds(ctx)
	if err != nil {
		return nil, err
	}
	own := make([]Hold, len(a.RangeSets))
	for _, h := range holds {
		set := a.setOf(h.IP)
		switch {
		case a.expired(h):
		case h.Pod != pod || set < 0:
			continue
		case !own[set].IP.IsValid():
			own[set] = h
			continue
		case own[set].Until.Before(h.Until):
			own[set], h = h, own[set]
		}
		if _, err := a.Store.Release(ctx, h.IP, h.owner); err != nil {
			return nil, fmt.Errorf("releasing the hold of %s for pod %s: %w", h.IP, h.Pod, err)
		}
	}
	return own, nil
}

// retake hands h's address to owner: the hold is released, then the address
// claimed. It reports false when the hold went away first (expired and
// reclaimed elsewhere) or another claim came in between.
func (a *Allocator) retake(ctx context.Context, h Hold, owner store.Owner, set int) (bool, error) {
	ok, err := a.Store.Release(ctx, h.IP, h.owner)
	if err != nil || !ok {
		return false, wrapHold(h, err)
	}
	ok, err = a.Store.Claim(ctx, store.Claim{IP: h.IP, Owner: owner, RangeSet: set})
	if err != nil {
		return false, fmt.Errorf("claiming %s held for pod %s: %w", h.IP, h.Pod, err)
	}
	return ok, nil
}

// rehold puts back a hold retake took, when the ADD fails after all.
func (a *Allocator) rehold(ctx context.Context, h Hold, owner store.Owner, set int) error {
	if _, err := a.Store.Release(ctx, h.IP, owner); err != nil {
		return fmt.Errorf("undoing the claim of %s: %w", h.IP, err)
	}
	_, err := a.Store.Claim(ctx, store.Claim{IP: h.IP, Owner: h.owner, RangeSet: set})
	return wrapHold(h, err)
}

func wrapHold(h Hold, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("the hold of %s for pod %s: %w", h.IP, h.Pod, err)
}

// hold turns owner's allocation of ip (in range set set) into a hold for pod
// ending Sticky from now. Between the release and the claim another ADD
// may take the address; it is then simply not held.
func (a *Allocator) hold(ctx context.Context, ip netip.Addr, owner store.Owner, pod Pod, set int) (bool, error) {
	ok, err := a.Store.Release(ctx, ip, owner)
	if err != nil || !ok {
		return ok, err
	}
	until := a.now().Add(a.Sticky)
	if _, err := a.Store.Claim(ctx, store.Claim{IP: ip, Owner: holdOwner(pod, until), RangeSet: set}); err != nil {
		return true, fmt.Errorf("holding %s for pod %s: %w", ip, pod, err)
	}
	return true, nil
}

// giveUpHold frees a held address of range set idx for an ADD that found
// the set full: an expired hold if there is one, else the one that ends
// first. It returns the zero Addr when the set holds no hold.
func (a *Allocator) giveUpHold(ctx context.Context, idx int) (netip.Addr, error) {
	holds, err := a.Holds(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	holds = slices.DeleteFunc(holds, func(h Hold) bool { return a.setOf(h.IP) != idx })
	slices.SortFunc(holds, func(x, y Hold) int { return x.Until.Compare(y.Until) })
	for _, h := range holds {
		ok, err := a.Store.Release(ctx, h.IP, h.owner)
		if err != nil {
			return netip.Addr{}, wrapHold(h, err)
		}
		if ok {
			return h.IP, nil
		}
	}
	return netip.Addr{}, nil
}

// heldFor tells who holds ip when a claim of it failed, reclaiming the hold
// when it has expired (reclaimed true: claim again).
func (a *Allocator) heldFor(ctx context.Context, ip netip.Addr) (h Hold, reclaimed bool, err error) {
	holds, err := a.Holds(ctx)
	if err != nil {
		return Hold{}, false, err
	}
	for _, h := range holds {
		if h.IP != ip {
			continue
		}
		if !a.expired(h) {
			return h, false, nil
		}
		ok, err := a.Store.Release(ctx, h.IP, h.owner)
		return h, ok, wrapHold(h, err)
	}
	return Hold{}, false, nil
}

// GC releases every allocation whose owner is neither in valid, nor a hold
// that has not ended (the runtime's list knows nothing of departed pods),
// nor a LAN Service's (Owner.Kind is OwnerService).
func (a *Allocator) GC(ctx context.Context, valid []store.Owner) ([]store.Allocation, error) {
	now, isValid := a.now(), store.Valid(valid)
	return a.Store.GC(ctx, func(o store.Owner) bool {
		if _, until, ok := parseHold(o); ok {
			return now.Before(until)
		}
		// A LAN Service's address: villaged's to release, not the
		// runtime's.
		return o.Kind() == store.OwnerService || isValid(o)
	})
}
