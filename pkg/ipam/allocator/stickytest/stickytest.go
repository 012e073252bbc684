// Package stickytest is the suite every village-ipam store runs the
// allocator's sticky addresses (ipam.sticky) against, so that the disk,
// etcd and kubernetes stores are shown to behave the same: a departed pod's
// address is held for it, handed back on another node, kept from other pods
// until the pool is otherwise full, and reclaimed once the hold has ended.
// Time is a test clock moved by hand; nothing sleeps.
package stickytest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/ipam/allocator"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
)

// Open returns a store of one network for node (every call of one test
// with the same pool: "a" and "b" are two nodes sharing it; a node-local
// store returns the same pool for both).
type Open func(t *testing.T, node string) store.Store

// Clock is a test clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Move moves the clock by d.
func (c *Clock) Move(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

const grace = 5 * time.Minute

var (
	ctx   = context.Background()
	db0   = allocator.Pod{Namespace: "shop", Name: "db-0"}
	web   = allocator.Pod{Namespace: "shop", Name: "web-7f9c"}
	other = allocator.Pod{Namespace: "shop", Name: "db-1"}
)

// pool is the tests' range set: three addresses, .2-.4 (.1 is the gateway).
const pool = `[[{"subnet":"192.168.77.0/29","rangeStart":"192.168.77.2","rangeEnd":"192.168.77.4","gateway":"192.168.77.1"}]]`

// dualPool adds a one-address IPv6 range set.
const dualPool = `[[{"subnet":"192.168.77.0/29","rangeStart":"192.168.77.2","rangeEnd":"192.168.77.4","gateway":"192.168.77.1"}],
	[{"subnet":"fd77::/64","rangeStart":"fd77::10","rangeEnd":"fd77::10"}]]`

func sets(t *testing.T, ranges string) []config.RangeSet {
	t.Helper()
	c, err := config.Parse([]byte(`{"cniVersion":"1.1.0","name":"sticky","ipam":{"ranges":`+ranges+`}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	return c.RangeSets
}

// nodes are the allocators of nodes "a" and "b" over one pool.
type nodes struct {
	t     *testing.T
	clock *Clock
	a, b  *allocator.Allocator
	n     int
}

func newNodes(t *testing.T, open Open, ranges string) *nodes {
	c := &Clock{t: time.Unix(1_800_000_000, 0)}
	rs := sets(t, ranges)
	mk := func(node string) *allocator.Allocator {
		return &allocator.Allocator{Store: open(t, node), Network: "sticky", RangeSets: rs, Sticky: grace, Now: c.Now}
	}
	return &nodes{t: t, clock: c, a: mk("a"), b: mk("b")}
}

// container is a new attachment (a pod's sandbox) on some node.
func (n *nodes) container() store.Owner {
	n.n++
	return store.Owner{ContainerID: fmt.Sprintf("ctr%d", n.n), IfName: "net1"}
}

func (n *nodes) add(a *allocator.Allocator, o store.Owner, p allocator.Pod, want ...netip.Addr) ([]netip.Addr, error) {
	as, err := a.Allocate(ctx, allocator.Request{Owner: o, Pod: p, RequestedIPs: want})
	var out []netip.Addr
	for _, x := range as {
		out = append(out, x.IP)
	}
	return out, err
}

func (n *nodes) mustAdd(a *allocator.Allocator, o store.Owner, p allocator.Pod) netip.Addr {
	n.t.Helper()
	ips, err := n.add(a, o, p)
	if err != nil {
		n.t.Fatalf("ADD of %v for pod %s: %v", o, p, err)
	}
	return ips[0]
}

func (n *nodes) del(a *allocator.Allocator, o store.Owner, p allocator.Pod) {
	n.t.Helper()
	if rel, err := a.Release(ctx, o, p); err != nil || len(rel) == 0 {
		n.t.Fatalf("DEL of %v for pod %s: %v %v", o, p, rel, err)
	}
}

// holds lists the pool's holds as "ip=ns/name".
func (n *nodes) holds() string {
	n.t.Helper()
	hs, err := n.a.Holds(ctx)
	if err != nil {
		n.t.Fatal(err)
	}
	var s []string
	for _, h := range hs {
		s = append(s, h.IP.String()+"="+h.Pod.String())
	}
	return strings.Join(s, " ")
}

// Run runs the suite over the stores open makes.
func Run(t *testing.T, open Open) {
	t.Run("BackOnAnotherNode", func(t *testing.T) {
		n := newNodes(t, open, pool)
		c := n.container()
		n.mustAdd(n.a, c, db0)
		n.del(n.a, c, allocator.Pod{}) // a runtime without pod names: freed
		if h := n.holds(); h != "" {
			t.Fatalf("holds after a DEL without a pod: %q", h)
		}
		c = n.container()
		ip := n.mustAdd(n.a, c, db0)
		n.del(n.a, c, db0)
		if h := n.holds(); h != ip.String()+"="+db0.String() {
			t.Fatalf("holds after DEL of db-0: %q, want %s held for it", h, ip)
		}
		// Another pod meanwhile (on either node) is given the rest of the
		// pool, not the held address.
		for _, a := range []*allocator.Allocator{n.a, n.b} {
			if got := n.mustAdd(a, n.container(), web); got == ip {
				t.Fatalf("another pod got %s, held for db-0", got)
			}
		}
		// db-0 on node b gets it back; the hold is gone.
		if got := n.mustAdd(n.b, n.container(), db0); got != ip {
			t.Fatalf("db-0 back on node b got %s, want %s", got, ip)
		}
		if h := n.holds(); h != "" {
			t.Fatalf("holds after db-0 came back: %q", h)
		}
	})
	t.Run("FixedRequestForHeldAddress", func(t *testing.T) {
		n := newNodes(t, open, pool)
		c := n.container()
		ip := n.mustAdd(n.a, c, db0)
		n.del(n.a, c, db0)
		_, err := n.add(n.b, n.container(), web, ip)
		var ae *allocator.AddressError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), "held for pod shop/db-0") {
			t.Fatalf("fixed request for the held %s: %v, want an AddressError naming shop/db-0", ip, err)
		}
		// Once the hold has ended the same request reclaims it.
		n.clock.Move(grace)
		if got, err := n.add(n.b, n.container(), web, ip); err != nil || got[0] != ip {
			t.Fatalf("fixed request for %s after the hold ended: %v %v", ip, got, err)
		}
	})
	t.Run("FullPoolGivesUpTheHoldEndingFirst", func(t *testing.T) {
		n := newNodes(t, open, pool)
		c0, c1 := n.container(), n.container()
		ip0 := n.mustAdd(n.a, c0, db0)
		ip1 := n.mustAdd(n.a, c1, other)
		n.del(n.a, c0, db0)
		n.clock.Move(time.Minute)
		n.del(n.a, c1, other)
		n.mustAdd(n.b, n.container(), web) // the one free address
		if got := n.mustAdd(n.b, n.container(), web); got != ip0 {
			t.Fatalf("full pool: got %s, want %s (db-0's hold ends first)", got, ip0)
		}
		if h := n.holds(); h != ip1.String()+"="+other.String() {
			t.Fatalf("holds: %q, want only db-1's", h)
		}
		// db-0 finds the pool full too: db-1's hold goes the same way.
		if got := n.mustAdd(n.b, n.container(), db0); got != ip1 {
			t.Fatalf("db-0 in a full pool: got %s, want %s (db-1's hold)", got, ip1)
		}
		if _, err := n.add(n.b, n.container(), web); !errors.As(err, new(*allocator.ExhaustedError)) {
			t.Fatalf("ADD with every address live: %v, want exhausted", err)
		}
	})
	t.Run("EndedHoldsReclaimed", func(t *testing.T) {
		n := newNodes(t, open, pool)
		c := n.container()
		n.mustAdd(n.a, c, db0)
		n.del(n.a, c, db0)
		// GC from the node that holds it keeps a live hold, whatever the
		// runtime's list says...
		if rel, err := n.a.GC(ctx, nil); err != nil || len(rel) != 0 {
			t.Fatalf("GC during the hold released %v (%v)", rel, err)
		}
		n.clock.Move(grace - time.Second)
		if h := n.holds(); h == "" {
			t.Fatal("hold gone before its end")
		}
		// ...and releases it once it has ended.
		n.clock.Move(time.Second)
		if rel, err := n.a.GC(ctx, nil); err != nil || len(rel) != 1 {
			t.Fatalf("GC after the hold ended released %v (%v), want the hold", rel, err)
		}
		if h := n.holds(); h != "" {
			t.Fatalf("holds after GC: %q", h)
		}
		// An ADD of a sticky network reclaims ended holds of any pod.
		c = n.container()
		n.mustAdd(n.b, c, other)
		n.del(n.b, c, other)
		n.clock.Move(grace)
		n.mustAdd(n.a, n.container(), db0)
		if h := n.holds(); h != "" {
			t.Fatalf("holds after an ADD past their end: %q", h)
		}
	})
	t.Run("NewFixedAddressDropsTheHold", func(t *testing.T) {
		n := newNodes(t, open, pool)
		c := n.container()
		ip := n.mustAdd(n.a, c, db0)
		n.del(n.a, c, db0)
		want := netip.MustParseAddr("192.168.77.4")
		if ip == want {
			want = netip.MustParseAddr("192.168.77.3")
		}
		if got, err := n.add(n.b, n.container(), db0, want); err != nil || got[0] != want {
			t.Fatalf("db-0 asking for %s: %v %v", want, got, err)
		}
		if h := n.holds(); h != "" {
			t.Fatalf("holds after db-0 took another address: %q", h)
		}
	})
	t.Run("FailedADDKeepsTheHold", func(t *testing.T) {
		n := newNodes(t, open, dualPool)
		c := n.container()
		ips, err := n.add(n.a, c, db0)
		if err != nil || len(ips) != 2 {
			t.Fatalf("dual-stack ADD: %v %v", ips, err)
		}
		n.del(n.a, c, db0)
		// Web takes the held IPv6 address (the set is full), so db-0's next
		// ADD gets its IPv4 address back but fails on IPv6: the IPv4 hold
		// must survive the failed ADD.
		if got, err := n.add(n.b, n.container(), web); err != nil || got[1] != ips[1] {
			t.Fatalf("web: %v %v, want %s", got, err, ips[1])
		}
		if h := n.holds(); h != ips[0].String()+"="+db0.String() {
			t.Fatalf("holds: %q", h)
		}
		if _, err := n.add(n.b, n.container(), db0); !errors.As(err, new(*allocator.ExhaustedError)) {
			t.Fatalf("db-0 with the IPv6 set full: %v, want exhausted", err)
		}
		if h := n.holds(); h != ips[0].String()+"="+db0.String() {
			t.Fatalf("holds after the failed ADD: %q, want db-0's IPv4 hold back", h)
		}
	})
}
