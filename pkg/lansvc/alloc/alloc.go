// Package alloc gives LoadBalancer Services their LAN addresses, in the
// LAN pool's own store (pkg/ipam/store: disk, etcd or kubernetes), so a
// pod and a Service never hold the same address.
//
// An owner is a Service (its namespace and name) or a share group (the
// village.cni.io/lan-share key within one namespace); its record in the
// store is an ordinary allocation whose ContainerID starts with
// store.ServiceOwnerPrefix, which the IPAM plugin's GC leaves alone.
// Ensure gives an owner one address per family it asks for: the address
// requested (village.cni.io/lan-ip), or else the first free one of the
// Service ranges. A requested address that is taken or outside the
// ranges is an *Error, never a silent substitute.
//
// The store's Claim is "reserve if free", a compare-and-swap, and
// nothing else is assumed: two agents racing on one owner may each claim
// an address for it, and both then keep only the owner's lowest address
// of that family (Ensure reads the owner's holdings after its claim), so
// the race ends with one address.
package alloc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/validate"
)

// Owner IfNames: a Service's own address, and a share group's.
const (
	ifService = "svc"
	ifShare   = "share"
)

// MaxShareKey bounds a village.cni.io/lan-share key.
const MaxShareKey = 63

// ServiceOwner is the store owner of the address of Service ns/name
// (Kubernetes names have no '_', the separator).
func ServiceOwner(ns, name string) store.Owner {
	return store.Owner{ContainerID: store.ServiceOwnerPrefix + ns + "_" + name, IfName: ifService}
}

// ShareOwner is the store owner of share group key in namespace ns; key
// must pass CheckShareKey.
func ShareOwner(ns, key string) store.Owner {
	return store.Owner{ContainerID: store.ServiceOwnerPrefix + ns + "_" + key, IfName: ifShare}
}

// CheckShareKey says whether key can name a share group: 1-63 letters,
// digits, '.' and '-', starting with a letter or digit.
func CheckShareKey(key string) error {
	if len(key) == 0 || len(key) > MaxShareKey || strings.Contains(key, "_") {
		return fmt.Errorf("share key %q: 1-%d letters, digits, '.' and '-'", key, MaxShareKey)
	}
	if err := validate.ContainerID(key); err != nil {
		return fmt.Errorf("share key %q: 1-%d letters, digits, '.' and '-'", key, MaxShareKey)
	}
	return nil
}

// Kind is why an address could not be given.
type Kind int

// The refusals.
const (
	Exhausted Kind = iota + 1 // no free address in the ranges of a family
	Taken                     // the requested address is held by another owner
	Outside                   // the requested address is not in the Service ranges
	NoRange                   // no Service range of the requested family
)

// Error is a refusal; Addr is the requested address (Taken, Outside).
type Error struct {
	Kind   Kind
	Family int
	Addr   netip.Addr
	Ranges string
}

func (e *Error) Error() string {
	switch e.Kind {
	case Exhausted:
		return fmt.Sprintf("no free IPv%d address in the LAN Service ranges (%s)", e.Family, e.Ranges)
	case Taken:
		return fmt.Sprintf("LAN address %s is taken", e.Addr)
	case Outside:
		return fmt.Sprintf("LAN address %s is outside the LAN Service ranges (%s)", e.Addr, e.Ranges)
	default:
		return fmt.Sprintf("no LAN Service range of IPv%d", e.Family)
	}
}

// IsKind says whether err is a refusal of kind k.
func IsKind(err error, k Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == k
}

// Allocator allocates from Sets (macvlan.services.ranges) in Store.
type Allocator struct {
	Store store.Store
	Sets  []config.RangeSet
}

// Request is what one owner wants.
type Request struct {
	Owner store.Owner
	// Families are 4 and/or 6 (a Service's spec.ipFamilies); empty means
	// every family that has a range.
	Families []int
	// Addrs are the requested addresses, at most one per family; a family
	// with one is given exactly that.
	Addrs []netip.Addr
}

// Ensure makes the owner hold one address per family of r, and only
// those, and returns them sorted. On a refusal for one family the others
// are still held and returned with the error. An address the owner holds
// is released only when Ensure knows it is no longer the owner's (its
// family dropped, another address given or requested outside the
// ranges); a store error keeps it.
func (a *Allocator) Ensure(ctx context.Context, r Request) ([]netip.Addr, error) {
	fams := r.Families
	if len(fams) == 0 {
		for _, s := range a.Sets {
			fams = append(fams, s.Family())
		}
	}
	held, err := a.Store.ListByOwner(ctx, r.Owner)
	if err != nil {
		return nil, fmt.Errorf("listing the LAN addresses of %s: %w", r.Owner, err)
	}
	var got []netip.Addr
	var errs []error
	// unsure: families whose address Ensure could not settle, for any
	// reason but a definite "not this one" (Outside). The owner keeps
	// what it holds of them: a store that fails for a moment (a timeout,
	// a lost leader) must never cost a Service its address.
	unsure := map[int]bool{}
	for _, fam := range slices.Compact(slices.Sorted(slices.Values(fams))) {
		ip, err := a.ensureFamily(ctx, r, fam, held)
		if err != nil {
			errs = append(errs, err)
			if !IsKind(err, Outside) {
				unsure[fam] = true
			}
			continue
		}
		got = append(got, ip)
	}
	// Addresses of the owner no longer wanted (a family dropped, another
	// address requested).
	for _, h := range held {
		if !slices.Contains(got, h) && !unsure[family(h)] {
			if _, err := a.Store.Release(ctx, h, r.Owner); err != nil {
				errs = append(errs, fmt.Errorf("releasing %s of %s: %w", h, r.Owner, err))
			}
		}
	}
	slices.SortFunc(got, netip.Addr.Compare)
	return got, errors.Join(errs...)
}

// InRanges says whether ip is an allocatable address of the Service
// ranges.
func (a *Allocator) InRanges(ip netip.Addr) bool {
	_, set := a.set(family(ip))
	return set != nil && allocatable(set, ip)
}

// Holds says whether held (an owner's addresses, as Owners lists them)
// is already what Ensure would make of r: one allocatable address per
// family of r, the requested one where r names one, and nothing else.
func (a *Allocator) Holds(held []netip.Addr, r Request) bool {
	fams := r.Families
	if len(fams) == 0 {
		for _, s := range a.Sets {
			fams = append(fams, s.Family())
		}
	}
	fams = slices.Compact(slices.Sorted(slices.Values(fams)))
	if len(held) != len(fams) {
		return false
	}
	for _, fam := range fams {
		_, set := a.set(fam)
		n := 0
		for _, h := range held {
			if family(h) == fam && set != nil && allocatable(set, h) {
				n++
				for _, want := range r.Addrs {
					if family(want) == fam && want != h {
						return false
					}
				}
			}
		}
		if n != 1 {
			return false
		}
	}
	return true
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func (a *Allocator) set(fam int) (int, config.RangeSet) {
	for i, s := range a.Sets {
		if s.Family() == fam {
			return i, s
		}
	}
	return -1, nil
}

// ensureFamily gives the owner its one address of family fam.
func (a *Allocator) ensureFamily(ctx context.Context, r Request, fam int, held []netip.Addr) (netip.Addr, error) {
	idx, set := a.set(fam)
	if set == nil {
		return netip.Addr{}, &Error{Kind: NoRange, Family: fam}
	}
	var want netip.Addr
	for _, ip := range r.Addrs {
		if family(ip) == fam {
			want = ip
		}
	}
	if want.IsValid() {
		if slices.Contains(held, want) {
			return want, nil
		}
		if !allocatable(set, want) {
			return netip.Addr{}, &Error{Kind: Outside, Family: fam, Addr: want, Ranges: set.String()}
		}
		ok, err := a.Store.Claim(ctx, store.Claim{IP: want, Owner: r.Owner, RangeSet: idx})
		if err != nil {
			return netip.Addr{}, fmt.Errorf("claiming %s for %s: %w", want, r.Owner, err)
		}
		if !ok {
			// Another agent may have claimed it for the same owner; a
			// store that cannot say is an error, not a refusal.
			mine, err := a.Store.ListByOwner(ctx, r.Owner)
			if err != nil {
				return netip.Addr{}, fmt.Errorf("listing the LAN addresses of %s: %w", r.Owner, err)
			}
			if slices.Contains(mine, want) {
				return want, nil
			}
			return netip.Addr{}, &Error{Kind: Taken, Family: fam, Addr: want}
		}
		return want, nil
	}
	for _, h := range held {
		if family(h) == fam && allocatable(set, h) {
			return a.settle(ctx, r.Owner, fam, h)
		}
	}
	for {
		all, err := a.Store.List(ctx)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("listing the LAN pool: %w", err)
		}
		taken := map[netip.Addr]bool{}
		for _, al := range all {
			taken[al.IP] = true
			if al.Owner == r.Owner && family(al.IP) == fam && allocatable(set, al.IP) {
				return a.settle(ctx, r.Owner, fam, al.IP) // claimed by another agent meanwhile
			}
		}
		free, ok := firstFree(set, taken)
		if !ok {
			return netip.Addr{}, &Error{Kind: Exhausted, Family: fam, Ranges: set.String()}
		}
		claimed, err := a.Store.Claim(ctx, store.Claim{IP: free, Owner: r.Owner, RangeSet: idx})
		if err != nil {
			return netip.Addr{}, fmt.Errorf("claiming %s for %s: %w", free, r.Owner, err)
		}
		if claimed {
			return a.settle(ctx, r.Owner, fam, free)
		}
		// Taken since the list: list again.
		if err := ctx.Err(); err != nil {
			return netip.Addr{}, err
		}
	}
}

// settle ends a race between agents that each claimed an address for the
// same owner: the owner keeps its lowest address of the family, and the
// others are released. Whoever reads the holdings last sees every claim.
func (a *Allocator) settle(ctx context.Context, owner store.Owner, fam int, ip netip.Addr) (netip.Addr, error) {
	mine, err := a.Store.ListByOwner(ctx, owner)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("listing the LAN addresses of %s: %w", owner, err)
	}
	_, set := a.set(fam)
	keep := ip
	for _, m := range mine {
		if family(m) == fam && allocatable(set, m) && m.Less(keep) {
			keep = m
		}
	}
	for _, m := range mine {
		if family(m) == fam && m != keep {
			if _, err := a.Store.Release(ctx, m, owner); err != nil {
				return netip.Addr{}, fmt.Errorf("releasing %s of %s: %w", m, owner, err)
			}
		}
	}
	return keep, nil
}

// Release frees every address of owner.
func (a *Allocator) Release(ctx context.Context, owner store.Owner) ([]netip.Addr, error) {
	held, err := a.Store.ListByOwner(ctx, owner)
	if err != nil {
		return nil, fmt.Errorf("listing the LAN addresses of %s: %w", owner, err)
	}
	var out []netip.Addr
	var errs []error
	for _, h := range held {
		ok, err := a.Store.Release(ctx, h, owner)
		if err != nil {
			errs = append(errs, fmt.Errorf("releasing %s of %s: %w", h, owner, err))
		}
		if ok {
			out = append(out, h)
		}
	}
	return out, errors.Join(errs...)
}

// Owners lists every Service and share owner in the store with its
// addresses (for the controller's sweep of owners that are gone).
func (a *Allocator) Owners(ctx context.Context) (map[store.Owner][]netip.Addr, error) {
	all, err := a.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the LAN pool: %w", err)
	}
	out := map[store.Owner][]netip.Addr{}
	for _, al := range all {
		if al.Owner.Kind() == store.OwnerService {
			out[al.Owner] = append(out[al.Owner], al.IP)
		}
	}
	return out, nil
}

func allocatable(set config.RangeSet, a netip.Addr) bool {
	for _, r := range set {
		if r.Allocatable(a) {
			return true
		}
	}
	return false
}

// firstFree is the lowest allocatable address of set not in taken.
func firstFree(set config.RangeSet, taken map[netip.Addr]bool) (netip.Addr, bool) {
	for _, r := range set {
		for ip := r.RangeStart; ip.IsValid() && ip.Compare(r.RangeEnd) <= 0; ip = ip.Next() {
			if !taken[ip] && r.Allocatable(ip) {
				return ip, true
			}
		}
	}
	return netip.Addr{}, false
}
