// Package storetest holds what tests of village-ipam's stores share: an
// in-memory Store and a conformance suite every Store implementation (disk,
// etcd) runs against itself.
package storetest

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/village-cni/village/pkg/ipam/store"
)

// Memory is an in-memory store.Store. Each method is atomic on its own; Lock
// is a real mutex unless NoLock is set, in which case it is a no-op (the way
// a transactional backend behaves).
type Memory struct {
	NoLock bool

	lockMu sync.Mutex
	mu     sync.Mutex
	allocs map[netip.Addr]store.Owner
	last   map[int]netip.Addr
	// FailClaim, when set, is returned by Claim for that address.
	FailClaim map[netip.Addr]error
}

var _ store.Store = (*Memory)(nil)

// NewMemory returns an empty Memory store.
func NewMemory() *Memory {
	return &Memory{allocs: map[netip.Addr]store.Owner{}, last: map[int]netip.Addr{}}
}

func (m *Memory) Lock(ctx context.Context) (func() error, error) {
	if m.NoLock {
		return func() error { return nil }, nil
	}
	m.lockMu.Lock()
	return func() error { m.lockMu.Unlock(); return nil }, nil
}

func (m *Memory) Claim(ctx context.Context, c store.Claim) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.FailClaim[c.IP]; err != nil {
		return false, err
	}
	if _, ok := m.allocs[c.IP]; ok {
		return false, nil
	}
	m.allocs[c.IP] = c.Owner
	m.last[c.RangeSet] = c.IP
	return true, nil
}

func (m *Memory) Release(ctx context.Context, ip netip.Addr, o store.Owner) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.allocs[ip]; ok && cur == o {
		delete(m.allocs, ip)
		return true, nil
	}
	return false, nil
}

func (m *Memory) ListByOwner(ctx context.Context, o store.Owner) ([]netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []netip.Addr
	for ip, cur := range m.allocs {
		if cur == o {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func (m *Memory) List(ctx context.Context) ([]store.Allocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []store.Allocation
	for ip, o := range m.allocs {
		out = append(out, store.Allocation{IP: ip, Owner: o})
	}
	slices.SortFunc(out, func(a, b store.Allocation) int { return a.IP.Compare(b.IP) })
	return out, nil
}

func (m *Memory) LastReserved(ctx context.Context, rangeSet int) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last[rangeSet], nil
}

func (m *Memory) GC(ctx context.Context, keep func(store.Owner) bool) ([]store.Allocation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []store.Allocation
	for ip, o := range m.allocs {
		if !keep(o) {
			delete(m.allocs, ip)
			out = append(out, store.Allocation{IP: ip, Owner: o})
		}
	}
	return out, nil
}

func (m *Memory) Close() error { return nil }

// Run checks the Store contract on stores made by open (each call must
// return an empty store of its own).
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := context.Background()
	a := store.Owner{ContainerID: "ctr-a", IfName: "eth0"}
	a2 := store.Owner{ContainerID: "ctr-a", IfName: "net1"}
	b := store.Owner{ContainerID: "ctr-b", IfName: "eth0"}
	ip1, ip2, ip3 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("fd00::2")

	claim := func(t *testing.T, s store.Store, ip netip.Addr, o store.Owner, set int) bool {
		t.Helper()
		ok, err := s.Claim(ctx, store.Claim{IP: ip, Owner: o, RangeSet: set})
		if err != nil {
			t.Fatalf("Claim(%s, %v): %v", ip, o, err)
		}
		return ok
	}
	list := func(t *testing.T, s store.Store, o store.Owner) []netip.Addr {
		t.Helper()
		got, err := s.ListByOwner(ctx, o)
		if err != nil {
			t.Fatalf("ListByOwner(%v): %v", o, err)
		}
		slices.SortFunc(got, netip.Addr.Compare)
		return got
	}

	t.Run("ClaimIsExclusive", func(t *testing.T) {
		s := open(t)
		if !claim(t, s, ip1, a, 0) {
			t.Fatal("first claim refused")
		}
		if claim(t, s, ip1, b, 0) || claim(t, s, ip1, a, 0) {
			t.Fatal("second claim of the same address granted")
		}
		if !claim(t, s, ip3, a, 1) {
			t.Fatal("IPv6 claim refused")
		}
		if got := list(t, s, a); !slices.Equal(got, []netip.Addr{ip1, ip3}) {
			t.Fatalf("ListByOwner(a) = %v", got)
		}
		if got := list(t, s, a2); len(got) != 0 {
			t.Fatalf("ListByOwner(a/net1) = %v, want none", got)
		}
		if got, _ := s.LastReserved(ctx, 0); got != ip1 {
			t.Fatalf("LastReserved(0) = %v", got)
		}
		if got, _ := s.LastReserved(ctx, 1); got != ip3 {
			t.Fatalf("LastReserved(1) = %v", got)
		}
		if got, _ := s.LastReserved(ctx, 7); got.IsValid() {
			t.Fatalf("LastReserved(7) = %v, want none", got)
		}
	})
	t.Run("ReleaseChecksOwner", func(t *testing.T) {
		s := open(t)
		claim(t, s, ip1, a, 0)
		if ok, err := s.Release(ctx, ip1, b); ok || err != nil {
			t.Fatalf("Release by another owner = %v, %v", ok, err)
		}
		if ok, err := s.Release(ctx, ip1, a); !ok || err != nil {
			t.Fatalf("Release by owner = %v, %v", ok, err)
		}
		if ok, err := s.Release(ctx, ip1, a); ok || err != nil {
			t.Fatalf("repeated Release = %v, %v", ok, err)
		}
		if !claim(t, s, ip1, b, 0) {
			t.Fatal("released address cannot be claimed again")
		}
	})
	t.Run("ListAndGC", func(t *testing.T) {
		s := open(t)
		claim(t, s, ip1, a, 0)
		claim(t, s, ip2, b, 0)
		claim(t, s, ip3, a2, 1)
		all, err := s.List(ctx)
		if err != nil || len(all) != 3 {
			t.Fatalf("List = %v, %v", all, err)
		}
		released, err := s.GC(ctx, store.Valid([]store.Owner{a, {ContainerID: "gone", IfName: "eth0"}}))
		if err != nil {
			t.Fatal(err)
		}
		var rel []netip.Addr
		for _, r := range released {
			rel = append(rel, r.IP)
		}
		slices.SortFunc(rel, netip.Addr.Compare)
		if !slices.Equal(rel, []netip.Addr{ip2, ip3}) {
			t.Fatalf("GC released %v, want %v %v", rel, ip2, ip3)
		}
		if got := list(t, s, a); !slices.Equal(got, []netip.Addr{ip1}) {
			t.Fatalf("after GC a holds %v", got)
		}
		if released, err = s.GC(ctx, store.Valid(nil)); err != nil || len(released) != 1 {
			t.Fatalf("GC(nil) = %v, %v; want everything released", released, err)
		}
	})
	t.Run("Lock", func(t *testing.T) {
		s := open(t)
		unlock, err := s.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !claim(t, s, ip1, a, 0) {
			t.Fatal("claim under lock refused")
		}
		if err := unlock(); err != nil {
			t.Fatal(err)
		}
		if got := list(t, s, a); !slices.Equal(got, []netip.Addr{ip1}) {
			t.Fatalf("after unlock a holds %v", got)
		}
	})
	t.Run("ParallelClaims", func(t *testing.T) {
		s := open(t)
		var wg sync.WaitGroup
		wins := make([]int, 8)
		for g := range wins {
			wg.Go(func() {
				o := store.Owner{ContainerID: "p" + string(rune('a'+g)), IfName: "eth0"}
				for i := range 16 {
					ip := netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})
					ok, err := s.Claim(ctx, store.Claim{IP: ip, Owner: o})
					if err != nil && !errors.Is(err, store.ErrBusy) {
						t.Error(err)
					}
					if ok {
						wins[g]++
					}
				}
			})
		}
		wg.Wait()
		total := 0
		for _, w := range wins {
			total += w
		}
		if total != 16 {
			t.Fatalf("16 addresses claimed %d times in total", total)
		}
	})
}
