// Package allocator hands out addresses from village-ipam's range sets over a
// store.Store: one address per range set, round-robin after the set's last
// reserved address, never the gateway, the network or the (IPv4) broadcast
// address. It holds no state of its own; the store is the only truth, and
// the only operation it relies on for exclusivity is the store's atomic Claim.
// It also keeps a departed pod's address for the pod for a while (sticky
// addresses, hold.go).
package allocator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"time"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
)

// Allocator allocates for one network.
type Allocator struct {
	Store     store.Store
	Network   string
	RangeSets []config.RangeSet
	// Sticky is how long a released pod's address stays held for the pod
	// (ipam "sticky"); 0 frees it at once.
	Sticky time.Duration
	// Now is the clock holds are made and ended by (time.Now when nil).
	Now func() time.Time
}

// Request is one ADD.
type Request struct {
	Owner store.Owner
	// Pod is the Kubernetes pod of the ADD, when known: with Sticky, an
	// address held for it is handed back.
	Pod Pod
	// RequestedIPs must all be granted, each from the range set holding it.
	RequestedIPs []netip.Addr
}

// Assignment is an address handed out (or already held) for one range set.
type Assignment struct {
	RangeSet int
	Range    config.Range // the range holding IP (its subnet and gateway go into the result)
	IP       netip.Addr
}

// Prefix is IP with the subnet's prefix length.
func (a Assignment) Prefix() netip.Prefix { return netip.PrefixFrom(a.IP, a.Range.Subnet.Bits()) }

// ExhaustedError says a range set has no free address.
type ExhaustedError struct {
	Network string
	Ranges  config.RangeSet
}

func (e *ExhaustedError) Error() string {
	word := "range"
	if len(e.Ranges) > 1 {
		word = "ranges"
	}
	return fmt.Sprintf("no free address in %s %s of network %q; release addresses (DEL or GC stale containers) or widen the range", word, e.Ranges, e.Network)
}

// AddressError says a requested address cannot be granted.
type AddressError struct {
	IP     netip.Addr
	Reason string
	// Outside: the address is in no range of the network (not merely
	// taken), so asking again can never succeed.
	Outside bool
}

func (e *AddressError) Error() string { return fmt.Sprintf("requested address %s %s", e.IP, e.Reason) }

// Preparer is implemented by stores that can do part of a claim for owner
// before the store-wide lock is taken. Prepare is best effort: when it
// cannot, the claim does the work itself under the lock.
type Preparer interface {
	Prepare(owner store.Owner)
}

// lock takes the store's lock. The returned func, deferred with the caller's
// named error, releases it and reports a failed unlock when nothing else
// failed.
func (a *Allocator) lock(ctx context.Context) (func(*error), error) {
	unlock, err := a.Store.Lock(ctx)
	if err != nil {
		return nil, err
	}
	return func(err *error) {
		if uerr := unlock(); uerr != nil && *err == nil {
			*err = uerr
		}
	}, nil
}

// Allocate returns one address per range set for req.Owner. When the owner
// already holds addresses (a repeated ADD) they are returned again, and only
// range sets it holds nothing in get a new one. On error nothing claimed by
// this call is kept.
func (a *Allocator) Allocate(ctx context.Context, req Request) (_ []Assignment, err error) {
	if p, ok := a.Store.(Preparer); ok {
		// Before the lock: whatever a claim can do without it (the disk
		// store's record write) does not serialise parallel ADDs.
		p.Prepare(req.Owner)
	}
	unlock, err := a.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock(&err)

	held, err := a.held(ctx, req.Owner)
	if err != nil {
		return nil, err
	}
	wanted, err := a.placeRequested(req.RequestedIPs, held)
	if err != nil {
		return nil, err
	}
	own := make([]Hold, len(a.RangeSets))
	if a.sticky(req.Pod) {
		if own, err = a.ownHolds(ctx, req.Pod); err != nil {
			return nil, err
		}
	}

	out := make([]Assignment, len(a.RangeSets))
	var claimed []netip.Addr
	retaken := map[netip.Addr]Hold{}
	defer func() {
		if err == nil {
			return
		}
		for _, ip := range claimed {
			if h, ok := retaken[ip]; ok {
				err = errors.Join(err, a.rehold(ctx, h, req.Owner, a.setOf(ip)))
				continue
			}
			if _, rerr := a.Store.Release(ctx, ip, req.Owner); rerr != nil {
				err = errors.Join(err, fmt.Errorf("undoing the claim of %s: %w", ip, rerr))
			}
		}
	}()
	for i, set := range a.RangeSets {
		if h := own[i]; h.IP.IsValid() && !held[i].IsValid() {
			if wanted[i].IsValid() && wanted[i] != h.IP {
				// The pod now asks for another address: its hold goes.
				if _, err := a.Store.Release(ctx, h.IP, h.owner); err != nil {
					return nil, wrapHold(h, err)
				}
			} else {
				ok, err := a.retake(ctx, h, req.Owner, i)
				if err != nil {
					return nil, err
				}
				if ok {
					claimed = append(claimed, h.IP)
					retaken[h.IP] = h
					out[i] = a.assignment(i, h.IP)
					continue
				}
			}
		}
		switch {
		case held[i].IsValid():
			out[i] = a.assignment(i, held[i])
		case wanted[i].IsValid():
			if err := a.claimWanted(ctx, wanted[i], req.Owner, i); err != nil {
				return nil, err
			}
			claimed = append(claimed, wanted[i])
			out[i] = a.assignment(i, wanted[i])
		default:
			ip, err := a.claimNext(ctx, i, set, req.Owner)
			if err != nil {
				return nil, err
			}
			claimed = append(claimed, ip)
			out[i] = a.assignment(i, ip)
		}
	}
	return out, nil
}

// claimWanted claims a requested address; one held for a departed pod is
// refused while the hold lasts and reclaimed once it has ended.
func (a *Allocator) claimWanted(ctx context.Context, ip netip.Addr, owner store.Owner, set int) error {
	for range 2 {
		ok, err := a.Store.Claim(ctx, store.Claim{IP: ip, Owner: owner, RangeSet: set})
		if err != nil {
			return fmt.Errorf("claiming %s: %w", ip, err)
		}
		if ok {
			return nil
		}
		h, reclaimed, err := a.heldFor(ctx, ip)
		if err != nil {
			return err
		}
		if reclaimed {
			continue // an ended hold: claim again
		}
		if h.IP.IsValid() {
			return &AddressError{IP: ip, Reason: fmt.Sprintf("is held for pod %s until %s (ipam.sticky) in network %q", h.Pod, h.Until.UTC().Format(time.RFC3339), a.Network)}
		}
		break
	}
	return &AddressError{IP: ip, Reason: fmt.Sprintf("is already allocated in network %q", a.Network)}
}

func (a *Allocator) assignment(set int, ip netip.Addr) Assignment {
	rs := a.RangeSets[set]
	return Assignment{RangeSet: set, Range: rs[rs.RangeFor(ip)], IP: ip}
}

// held maps each range set to the address owner already holds in it.
func (a *Allocator) held(ctx context.Context, owner store.Owner) ([]netip.Addr, error) {
	ips, err := a.Store.ListByOwner(ctx, owner)
	if err != nil {
		return nil, fmt.Errorf("looking up the addresses of %v: %w", owner, err)
	}
	held := make([]netip.Addr, len(a.RangeSets))
	for _, ip := range ips {
		for i, set := range a.RangeSets {
			if !held[i].IsValid() && set.RangeFor(ip) >= 0 {
				held[i] = ip
				break
			}
		}
	}
	return held, nil
}

// placeRequested maps each requested address to its range set and checks it
// may be handed out.
func (a *Allocator) placeRequested(reqs []netip.Addr, held []netip.Addr) ([]netip.Addr, error) {
	wanted := make([]netip.Addr, len(a.RangeSets))
	for _, ip := range reqs {
		ip = ip.Unmap()
		set, r := -1, -1
		for i, s := range a.RangeSets {
			if r = s.RangeFor(ip); r >= 0 {
				set = i
				break
			}
		}
		if set < 0 {
			return nil, &AddressError{IP: ip, Outside: true, Reason: fmt.Sprintf("is outside every range of network %q", a.Network)}
		}
		rng := a.RangeSets[set][r]
		switch {
		case ip == rng.Gateway:
			return nil, &AddressError{IP: ip, Reason: fmt.Sprintf("is the gateway of %s", rng.Subnet)}
		case cidr.IsNetwork(rng.Subnet, ip):
			return nil, &AddressError{IP: ip, Reason: fmt.Sprintf("is the network address of %s", rng.Subnet)}
		case cidr.IsBroadcast(rng.Subnet, ip):
			return nil, &AddressError{IP: ip, Reason: fmt.Sprintf("is the broadcast address of %s", rng.Subnet)}
		case wanted[set].IsValid():
			return nil, &AddressError{IP: ip, Reason: fmt.Sprintf("and %s are both in range set %s; at most one address per range set can be requested", wanted[set], a.RangeSets[set])}
		case held[set].IsValid() && held[set] != ip:
			return nil, &AddressError{IP: ip, Reason: fmt.Sprintf("cannot be granted: this container interface already holds %s in range set %s; DEL it first", held[set], a.RangeSets[set])}
		}
		wanted[set] = ip
	}
	return wanted, nil
}

// cursor is a position in a range set.
type cursor struct {
	r  int
	ip netip.Addr
}

func advance(set config.RangeSet, c cursor) cursor {
	if c.ip == set[c.r].RangeEnd {
		c.r = (c.r + 1) % len(set)
		return cursor{c.r, set[c.r].RangeStart}
	}
	return cursor{c.r, c.ip.Next()}
}

// claimNext claims the first free address after the set's last reserved one,
// going round the whole set once.
func (a *Allocator) claimNext(ctx context.Context, idx int, set config.RangeSet, owner store.Owner) (netip.Addr, error) {
	start := cursor{0, set[0].RangeStart}
	last, err := a.Store.LastReserved(ctx, idx)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reading the last reserved address of range set %s: %w", set, err)
	}
	if r := set.RangeFor(last); last.IsValid() && r >= 0 {
		start = advance(set, cursor{r, last.Unmap()})
	}
	c := start
	for {
		if err := ctx.Err(); err != nil {
			return netip.Addr{}, err
		}
		if set[c.r].Allocatable(c.ip) {
			ok, err := a.Store.Claim(ctx, store.Claim{IP: c.ip, Owner: owner, RangeSet: idx})
			if err != nil {
				return netip.Addr{}, fmt.Errorf("claiming %s: %w", c.ip, err)
			}
			if ok {
				return c.ip, nil
			}
		}
		if c = advance(set, c); c == start {
			break
		}
	}
	// Full: the addresses held for departed pods are what is left.
	ip, err := a.giveUpHold(ctx, idx)
	if err != nil {
		return netip.Addr{}, err
	}
	if ip.IsValid() {
		ok, err := a.Store.Claim(ctx, store.Claim{IP: ip, Owner: owner, RangeSet: idx})
		if err != nil {
			return netip.Addr{}, fmt.Errorf("claiming %s: %w", ip, err)
		}
		if ok {
			return ip, nil
		}
	}
	return netip.Addr{}, &ExhaustedError{Network: a.Network, Ranges: set}
}

// Release frees every address owner holds in this network (also ones outside
// the configured ranges, e.g. after the ranges changed) and returns them.
// With Sticky and pod known, an address in a configured range set is held
// for pod instead of freed (and returned too). Nothing held is not an error.
func (a *Allocator) Release(ctx context.Context, owner store.Owner, pod Pod) (_ []netip.Addr, err error) {
	unlock, err := a.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock(&err)
	ips, err := a.Store.ListByOwner(ctx, owner)
	if err != nil {
		return nil, fmt.Errorf("looking up the addresses of %v: %w", owner, err)
	}
	var released []netip.Addr
	var errs []error
	for _, ip := range ips {
		release := a.Store.Release
		if set := a.setOf(ip); set >= 0 && a.sticky(pod) {
			release = func(ctx context.Context, ip netip.Addr, owner store.Owner) (bool, error) {
				return a.hold(ctx, ip, owner, pod, set)
			}
		}
		ok, err := release(ctx, ip, owner)
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing %s: %w", ip, err))
			continue
		}
		if ok {
			released = append(released, ip)
		}
	}
	return released, errors.Join(errs...)
}

// Held returns the addresses owner holds that lie in a configured range set.
func (a *Allocator) Held(ctx context.Context, owner store.Owner) ([]Assignment, error) {
	held, err := a.held(ctx, owner)
	if err != nil {
		return nil, err
	}
	var out []Assignment
	for i, ip := range held {
		if ip.IsValid() {
			out = append(out, a.assignment(i, ip))
		}
	}
	return out, nil
}

// Usage is how full one range set is.
type Usage struct {
	RangeSet int
	Ranges   config.RangeSet
	Used     int
	// Capacity is the number of addresses that can be handed out (IPv6
	// ranges can hold more than any integer type).
	Capacity *big.Int
}

// Full reports whether no address is left.
func (u Usage) Full() bool { return u.Capacity.Cmp(big.NewInt(int64(u.Used))) <= 0 }

// Usage reports, per range set, how many addresses are used and how many can
// be handed out at all.
func (a *Allocator) Usage(ctx context.Context) ([]Usage, error) {
	all, err := a.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the allocations of network %q: %w", a.Network, err)
	}
	out := make([]Usage, len(a.RangeSets))
	for i, set := range a.RangeSets {
		out[i] = Usage{RangeSet: i, Ranges: set, Capacity: new(big.Int)}
		for _, r := range set {
			out[i].Capacity.Add(out[i].Capacity, capacity(r))
		}
		for _, al := range all {
			if r := set.RangeFor(al.IP); r >= 0 && set[r].Allocatable(al.IP) {
				out[i].Used++
			}
		}
	}
	return out, nil
}

// capacity counts the allocatable addresses of r.
func capacity(r config.Range) *big.Int {
	n := new(big.Int).Sub(new(big.Int).SetBytes(r.RangeEnd.AsSlice()), new(big.Int).SetBytes(r.RangeStart.AsSlice()))
	n.Add(n, big.NewInt(1))
	excluded := map[netip.Addr]bool{r.Gateway: true, r.Subnet.Addr(): true}
	if r.Subnet.Addr().Is4() {
		excluded[cidr.Last(r.Subnet)] = true
	}
	for ip := range excluded {
		if r.Contains(ip) {
			n.Sub(n, big.NewInt(1))
		}
	}
	return n
}
