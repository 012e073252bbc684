package alloc_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/lansvc/alloc"
)

// flaky is the real disk store whose ListByOwner or Claim fails once, on
// the call numbered failAt (1-based), as a store does for a moment (a
// timeout, a lost leader). The store is not what is under test: Ensure's
// handling of its failure is.
type flaky struct {
	store.Store
	op     string
	failAt int
	calls  int
}

var errTransient = errors.New("transient store failure")

func (f *flaky) hit(op string) error {
	if op != f.op {
		return nil
	}
	f.calls++
	if f.calls == f.failAt {
		return errTransient
	}
	return nil
}

func (f *flaky) ListByOwner(ctx context.Context, o store.Owner) ([]netip.Addr, error) {
	if err := f.hit("ListByOwner"); err != nil {
		return nil, err
	}
	return f.Store.ListByOwner(ctx, o)
}

func (f *flaky) Claim(ctx context.Context, c store.Claim) (bool, error) {
	if err := f.hit("Claim"); err != nil {
		return false, err
	}
	return f.Store.Claim(ctx, c)
}

// TestEnsureKeepsOnStoreError: an owner that holds its addresses keeps
// every one of them when the store fails for a moment in any step of
// Ensure; the error is returned, and the next Ensure (the store back)
// gives the same addresses.
func TestEnsureKeepsOnStoreError(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		op     string
		failAt int
		req    alloc.Request
	}{
		// The held address's settle reads the owner's holdings again.
		{"settle-list", "ListByOwner", 2, alloc.Request{}},
		// A new address requested: its claim fails; the old one stays.
		{"claim-requested", "Claim", 1, alloc.Request{Families: []int{4, 6}, Addrs: addrs("192.168.50.242")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			real := diskStore(t, t.TempDir())
			web := alloc.ServiceOwner("home", "web")
			held, err := (&alloc.Allocator{Store: real, Sets: sets(t, dual)}).Ensure(ctx, alloc.Request{Owner: web})
			if err != nil || len(held) != 2 {
				t.Fatalf("first Ensure = %v, %v", held, err)
			}
			f := &flaky{Store: real, op: tc.op, failAt: tc.failAt}
			a := &alloc.Allocator{Store: f, Sets: sets(t, dual)}
			req := tc.req
			req.Owner = web
			_, err = a.Ensure(ctx, req)
			if !errors.Is(err, errTransient) {
				t.Fatalf("Ensure with a failing store = %v, want the store's error", err)
			}
			now, err := real.ListByOwner(ctx, web)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(now, held) {
				t.Fatalf("after a transient store error the owner holds %v, had %v", now, held)
			}
		})
	}
}
