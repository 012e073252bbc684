package allocator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/storetest"
)

var ctx = context.Background()

func sets(t *testing.T, ranges string) []config.RangeSet {
	t.Helper()
	c, err := config.Parse([]byte(`{"cniVersion":"1.1.0","name":"x","ipam":{"ranges":`+ranges+`}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	return c.RangeSets
}

func owner(i int) store.Owner { return store.Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"} }

func ips(as []Assignment) string {
	var s []string
	for _, a := range as {
		s = append(s, a.Prefix().String())
	}
	return strings.Join(s, " ")
}

func TestAllocateRoundRobinAndSkips(t *testing.T) {
	// 10.1.0.0/29: .0 network, .1 gateway, .7 broadcast; explicit range covers them all.
	a := &Allocator{Store: storetest.NewMemory(), Network: "x",
		RangeSets: sets(t, `[[{"subnet":"10.1.0.0/29","rangeStart":"10.1.0.0","rangeEnd":"10.1.0.7"}]]`)}
	var got []string
	for i := range 5 {
		as, err := a.Allocate(ctx, Request{Owner: owner(i)})
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		got = append(got, ips(as))
		if gw := as[0].Range.Gateway.String(); gw != "10.1.0.1" {
			t.Fatalf("gateway %s", gw)
		}
	}
	if s := strings.Join(got, ","); s != "10.1.0.2/29,10.1.0.3/29,10.1.0.4/29,10.1.0.5/29,10.1.0.6/29" {
		t.Fatalf("order %s", s)
	}
	_, err := a.Allocate(ctx, Request{Owner: owner(9)})
	var ex *ExhaustedError
	if !errors.As(err, &ex) || err.Error() != `no free address in range 10.1.0.0-10.1.0.7 of network "x"; release addresses (DEL or GC stale containers) or widen the range` {
		t.Fatalf("exhaustion error = %v", err)
	}
	// Round-robin: after releasing .3 and .5 the next pick continues after
	// the last reserved (.6), wraps, and takes .3.
	for _, i := range []int{1, 3} {
		if rel, err := a.Release(ctx, owner(i), Pod{}); err != nil || len(rel) != 1 {
			t.Fatalf("release %d: %v %v", i, rel, err)
		}
	}
	as, err := a.Allocate(ctx, Request{Owner: owner(10)})
	if err != nil || ips(as) != "10.1.0.3/29" {
		t.Fatalf("after release got %s, %v", ips(as), err)
	}
	as, err = a.Allocate(ctx, Request{Owner: owner(11)})
	if err != nil || ips(as) != "10.1.0.5/29" {
		t.Fatalf("round-robin got %s, %v", ips(as), err)
	}
}

func TestAllocateDualStackMultiRange(t *testing.T) {
	a := &Allocator{Store: storetest.NewMemory(), Network: "x", RangeSets: sets(t, `[
		[{"subnet":"10.1.0.0/30"},{"subnet":"10.2.0.0/24","rangeStart":"10.2.0.10","rangeEnd":"10.2.0.11"}],
		[{"subnet":"fd00::/126"}]]`)}
	want := []string{
		"10.1.0.2/30 fd00::2/126",
		"10.2.0.10/24 fd00::3/126",
	}
	for i, w := range want {
		as, err := a.Allocate(ctx, Request{Owner: owner(i)})
		if err != nil || ips(as) != w {
			t.Fatalf("allocation %d = %q, %v; want %q", i, ips(as), err, w)
		}
	}
	// IPv6 set exhausted: the IPv4 address claimed by this call is given back.
	_, err := a.Allocate(ctx, Request{Owner: owner(5)})
	if err == nil || !strings.Contains(err.Error(), "range fd00::1-fd00::3") {
		t.Fatalf("want IPv6 exhaustion, got %v", err)
	}
	if h, _ := a.Store.ListByOwner(ctx, owner(5)); len(h) != 0 {
		t.Fatalf("failed ADD kept %v", h)
	}
	u, err := a.Usage(ctx)
	if err != nil || u[0].Full() || !u[1].Full() || u[0].Used != 2 || u[0].Capacity.Int64() != 3 {
		t.Fatalf("usage %+v %v", u, err)
	}
}

func TestAllocateIdempotent(t *testing.T) {
	a := &Allocator{Store: storetest.NewMemory(), Network: "x", RangeSets: sets(t, `[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64"}]]`)}
	first, err := a.Allocate(ctx, Request{Owner: owner(1)})
	if err != nil {
		t.Fatal(err)
	}
	again, err := a.Allocate(ctx, Request{Owner: owner(1)})
	if err != nil || ips(again) != ips(first) {
		t.Fatalf("repeated ADD = %s, %v; want %s", ips(again), err, ips(first))
	}
	other, _ := a.Allocate(ctx, Request{Owner: store.Owner{ContainerID: "c1", IfName: "net1"}})
	if ips(other) == ips(first) {
		t.Fatal("another ifname of the same container got the same addresses")
	}
	// Only the missing set is filled when the owner holds part of it.
	if _, err := a.Store.Release(ctx, first[1].IP, owner(1)); err != nil {
		t.Fatal(err)
	}
	part, err := a.Allocate(ctx, Request{Owner: owner(1)})
	if err != nil || part[0].IP != first[0].IP || !part[1].IP.Is6() {
		t.Fatalf("partial repeat = %s, %v", ips(part), err)
	}
	held, err := a.Held(ctx, owner(1))
	if err != nil || ips(held) != ips(part) {
		t.Fatalf("Held = %s, %v", ips(held), err)
	}
}

func TestRequested(t *testing.T) {
	rs := `[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.255"}],[{"subnet":"fd00::/64"}]]`
	cases := []struct {
		name string
		req  []string
		want string // addresses, or error substring prefixed by "!"
	}{
		{"both families", []string{"fd00::99", "10.1.0.50"}, "10.1.0.50/24 fd00::99/64"},
		{"one of two", []string{"10.1.0.50"}, "10.1.0.50/24 fd00::2/64"},
		{"outside", []string{"10.9.0.1"}, "!requested address 10.9.0.1 is outside every range of network \"x\""},
		{"before rangeStart", []string{"10.1.0.5"}, "!10.1.0.5 is outside every range"},
		{"gateway", []string{"fd00::1"}, "!requested address fd00::1 is the gateway of fd00::/64"},
		{"broadcast", []string{"10.1.0.255"}, "!is the broadcast address of 10.1.0.0/24"},
		{"two in one set", []string{"10.1.0.50", "10.1.0.51"}, "!at most one address per range set"},
		{"taken", []string{"10.1.0.20"}, "!requested address 10.1.0.20 is already allocated"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := &Allocator{Store: storetest.NewMemory(), Network: "x", RangeSets: sets(t, rs)}
			if _, err := a.Store.Claim(ctx, store.Claim{IP: netip.MustParseAddr("10.1.0.20"), Owner: owner(99)}); err != nil {
				t.Fatal(err)
			}
			var req []netip.Addr
			for _, s := range tc.req {
				req = append(req, netip.MustParseAddr(s))
			}
			as, err := a.Allocate(ctx, Request{Owner: owner(1), RequestedIPs: req})
			if strings.HasPrefix(tc.want, "!") {
				var ae *AddressError
				if err == nil || !strings.Contains(err.Error(), tc.want[1:]) || !errors.As(err, &ae) {
					t.Fatalf("err = %v, want %q", err, tc.want[1:])
				}
				if h, _ := a.Store.ListByOwner(ctx, owner(1)); len(h) != 0 {
					t.Fatalf("failed request kept %v", h)
				}
				return
			}
			if err != nil || ips(as) != tc.want {
				t.Fatalf("got %s, %v; want %s", ips(as), err, tc.want)
			}
		})
	}
	// A repeated ADD with the same request returns it; a different one is refused.
	a := &Allocator{Store: storetest.NewMemory(), Network: "x", RangeSets: sets(t, rs)}
	req := Request{Owner: owner(1), RequestedIPs: []netip.Addr{netip.MustParseAddr("10.1.0.50")}}
	if _, err := a.Allocate(ctx, req); err != nil {
		t.Fatal(err)
	}
	if as, err := a.Allocate(ctx, req); err != nil || as[0].IP != req.RequestedIPs[0] {
		t.Fatalf("repeat: %s %v", ips(as), err)
	}
	req.RequestedIPs[0] = netip.MustParseAddr("10.1.0.51")
	if _, err := a.Allocate(ctx, req); err == nil || !strings.Contains(err.Error(), "already holds 10.1.0.50") {
		t.Fatalf("changed request: %v", err)
	}
}

func TestStoreErrorsUndo(t *testing.T) {
	m := storetest.NewMemory()
	a := &Allocator{Store: m, Network: "x", RangeSets: sets(t, `[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64"}]]`)}
	boom := errors.New("disk on fire")
	m.FailClaim = map[netip.Addr]error{netip.MustParseAddr("fd00::2"): boom}
	_, err := a.Allocate(ctx, Request{Owner: owner(1)})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "claiming fd00::2") {
		t.Fatalf("err = %v", err)
	}
	if all, _ := m.List(ctx); len(all) != 0 {
		t.Fatalf("left behind %v", all)
	}
}

// TestRandomInterleavings runs many goroutines doing random ADDs and DELs
// against a small range and checks no address is ever held twice. With
// NoLock the store behaves like a transactional backend (no global lock), so
// only Claim's atomicity keeps allocations apart.
func TestRandomInterleavings(t *testing.T) {
	for _, noLock := range []bool{false, true} {
		t.Run(fmt.Sprintf("noLock=%v", noLock), func(t *testing.T) {
			m := storetest.NewMemory()
			m.NoLock = noLock
			a := &Allocator{Store: m, Network: "x", RangeSets: sets(t, `[[{"subnet":"10.1.0.0/28"}],[{"subnet":"fd00::/124"}]]`)}
			var (
				mu    sync.Mutex
				owned = map[netip.Addr]store.Owner{}
				wg    sync.WaitGroup
			)
			for g := range 8 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 1))
					for i := range 300 {
						o := owner(g*1000 + r.IntN(6))
						if r.IntN(3) == 0 {
							mu.Lock()
							for ip, ow := range owned {
								if ow == o {
									delete(owned, ip)
								}
							}
							mu.Unlock()
							if _, err := a.Release(ctx, o, Pod{}); err != nil {
								t.Error(err)
							}
							continue
						}
						as, err := a.Allocate(ctx, Request{Owner: o})
						var ex *ExhaustedError
						if errors.As(err, &ex) {
							continue
						}
						if err != nil {
							t.Errorf("step %d: %v", i, err)
							return
						}
						mu.Lock()
						for _, as := range as {
							if cur, ok := owned[as.IP]; ok && cur != o {
								t.Errorf("%s handed to %v while held by %v", as.IP, o, cur)
							}
							owned[as.IP] = o
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			all, _ := m.List(ctx)
			seen := map[netip.Addr]bool{}
			for _, al := range all {
				if seen[al.IP] {
					t.Fatalf("%s listed twice", al.IP)
				}
				seen[al.IP] = true
			}
		})
	}
}
