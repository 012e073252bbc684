package registry

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/etcdtest"
)

// TestReclaimOnceNeverWhileAlive: against a real etcd, a departed node's
// subnet lease and held keys (more than fit one transaction) are released by
// exactly one of many racing agents, only after the grace period; a node with
// a record is never marked, a marker for it is cleared, and a node that comes
// back before the reclaim keeps everything.
func TestReclaimOnceNeverWhileAlive(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	sp, err := NewSubnetSpace(cidr("10.80.0.0/16"), 24)
	if err != nil {
		t.Fatal(err)
	}
	agents := make([]*Registry, 8)
	var cli *clientv3.Client
	for i := range agents {
		agents[i], cli = newRegistry(t, srv, 5*time.Second)
	}
	r := agents[0]
	if _, err := r.Register(ctx, Node{Name: "alive", IP: "192.0.2.1"}); err != nil {
		t.Fatal(err)
	}
	var gone netip.Prefix
	for _, n := range []string{"alive", "gone", "back"} {
		p, err := r.LeaseSubnet(ctx, sp, n)
		if err != nil {
			t.Fatal(err)
		}
		if n == "gone" {
			gone = p
		}
	}
	// "gone" holds 40 keys elsewhere (a LAN pool): more than one transaction takes.
	var held []Held
	for i := range 40 {
		key := fmt.Sprintf("/village/ipam/ovl/ips/192.0.2.%d", 100+i)
		idx := fmt.Sprintf("/village/ipam/ovl/owners/c%d/net1/192.0.2.%d", i, 100+i)
		resp, err := cli.Txn(ctx).Then(clientv3.OpPut(key, `{"node":"gone"}`), clientv3.OpPut(idx, "")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, Held{Key: key, Rev: resp.Header.Revision, Delete: []string{key, idx}})
	}
	if _, err := cli.Put(ctx, r.DepartedPrefix()+"alive", "2000-01-01T00:00:00Z"); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	deps, err := r.Departures(ctx, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Departure{}
	for _, d := range deps {
		names[d.Node] = d
	}
	if _, ok := names["alive"]; ok || len(deps) != 2 || names["gone"].rev == 0 || names["back"].rev == 0 {
		t.Fatalf("departures %+v: want gone and back, not alive", deps)
	}
	if resp, _ := cli.Get(ctx, r.DepartedPrefix()+"alive"); resp.Count != 0 {
		t.Fatal("the marker of a node with a record was not cleared")
	}
	// Before the grace period: nothing.
	if _, won, err := r.Reclaim(ctx, names["gone"], time.Hour, t0.Add(time.Minute), held); err != nil || won {
		t.Fatalf("reclaim within the grace period: won %v, %v", won, err)
	}
	// "back" registers again before anyone reclaims it: its stale view must lose.
	if _, err := r.Register(ctx, Node{Name: "back", IP: "192.0.2.3"}); err != nil {
		t.Fatal(err)
	}
	if _, won, err := r.Reclaim(ctx, names["back"], time.Minute, t0.Add(time.Hour), nil); err != nil || won {
		t.Fatalf("reclaim of a node that is back: won %v, %v", won, err)
	}
	// Eight agents race for "gone", each with its own read of the departures.
	var wins atomic.Int32
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds, err := a.Departures(ctx, nil, t0.Add(time.Hour))
			if err != nil {
				t.Error(err)
				return
			}
			for _, d := range ds {
				if d.Node != "gone" {
					continue
				}
				subnets, won, err := a.Reclaim(ctx, d, time.Minute, t0.Add(time.Hour), held)
				if err != nil {
					t.Error(err)
				}
				if won {
					wins.Add(1)
					if len(subnets) != 1 || subnets[0] != gone {
						t.Errorf("reclaimed subnets %v, want %v", subnets, gone)
					}
				}
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d agents reclaimed node gone, want exactly 1", wins.Load())
	}
	leases, err := r.Subnets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int{}
	for _, n := range leases {
		owners[n]++
	}
	if owners["gone"] != 0 || owners["alive"] != 1 || owners["back"] != 1 {
		t.Fatalf("leases after the reclaim: %v", leases)
	}
	if resp, _ := cli.Get(ctx, "/village/ipam/ovl/", clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count != 0 {
		t.Fatalf("%d held keys of node gone left", resp.Count)
	}
	if resp, _ := cli.Get(ctx, r.DepartedPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count != 0 {
		t.Fatalf("%d departure markers left: gone's goes with the reclaim, back's when a pass sees its record", resp.Count)
	}
}

// TestReclaimStaleHolderNotRemarked replays, step by step against a real
// etcd, the interleaving that reclaimed a node twice under load: agent A
// reads the LAN pool (node n3 holds an address there), agent B then
// reclaims n3 (its subnet lease and that address), and only then does A's
// pass read the registry with its stale list of LAN holders. A must not plant
// a marker for n3, which holds nothing any more, and no later pass of either
// agent reclaims n3 again. Markers of nodes with nothing left are deleted
// without a reclaim.
func TestReclaimStaleHolderNotRemarked(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	sp, err := NewSubnetSpace(cidr("10.81.0.0/16"), 24)
	if err != nil {
		t.Fatal(err)
	}
	a, cli := newRegistry(t, srv, 5*time.Second)
	b, _ := newRegistry(t, srv, 5*time.Second)
	if _, err := a.LeaseSubnet(ctx, sp, "n3"); err != nil {
		t.Fatal(err)
	}
	lanKey := "/village/ipam/ovl/ips/192.0.2.30"
	put, err := cli.Put(ctx, lanKey, `{"node":"n3"}`)
	if err != nil {
		t.Fatal(err)
	}
	held := []Held{{Key: lanKey, Rev: put.Header.Revision, Delete: []string{lanKey}}}
	t0 := time.Now()
	grace := time.Minute

	// A's pass begins: it reads the LAN pool, and n3 holds an address there.
	staleA := map[string][]Held{"n3": held}

	// B marks n3, and once the grace period has passed, reclaims it.
	if _, err := b.Departures(ctx, map[string][]Held{"n3": held}, t0); err != nil {
		t.Fatal(err)
	}
	wins := 0
	reclaimAll := func(r *Registry, others map[string][]Held, h []Held, now time.Time) {
		t.Helper()
		deps, err := r.Departures(ctx, others, now)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range deps {
			subnets, won, err := r.Reclaim(ctx, d, grace, now, h)
			if err != nil {
				t.Fatal(err)
			}
			if won {
				wins++
				t.Logf("reclaimed %s: subnets %v", d.Node, subnets)
			}
		}
	}
	reclaimAll(b, map[string][]Held{"n3": held}, held, t0.Add(time.Hour))
	if wins != 1 {
		t.Fatalf("B's reclaim of n3: %d wins, want 1", wins)
	}

	// A's pass goes on with what it read before B's reclaim.
	reclaimAll(a, staleA, held, t0.Add(time.Hour))
	if resp, err := cli.Get(ctx, a.DepartedPrefix()+"n3"); err != nil || resp.Count != 0 {
		t.Errorf("a departure marker was planted for n3, which holds nothing (%v)", err)
	}
	// Later passes of both agents, past any grace period, find nothing.
	reclaimAll(a, nil, nil, t0.Add(2*time.Hour))
	reclaimAll(b, nil, nil, t0.Add(2*time.Hour))
	if wins != 1 {
		t.Fatalf("n3 was reclaimed %d times, want exactly once", wins)
	}

	// A marker of a node that holds nothing (planted by an older agent) is
	// deleted, not acted on.
	if _, err := cli.Put(ctx, a.DepartedPrefix()+"n4", "2000-01-01T00:00:00Z"); err != nil {
		t.Fatal(err)
	}
	reclaimAll(a, nil, nil, t0.Add(2*time.Hour))
	if resp, err := cli.Get(ctx, a.DepartedPrefix()+"n4"); err != nil || resp.Count != 0 || wins != 1 {
		t.Fatalf("the marker of n4, which holds nothing: %d left, %d reclaims (%v)", resp.Count, wins, err)
	}
	// A node marked while it held something, whose last allocation went
	// some other way before the grace period ended: its marker goes, and
	// nothing is reported reclaimed.
	lan5 := "/village/ipam/ovl/ips/192.0.2.50"
	put5, err := cli.Put(ctx, lan5, `{"node":"n5"}`)
	if err != nil {
		t.Fatal(err)
	}
	held5 := []Held{{Key: lan5, Rev: put5.Header.Revision, Delete: []string{lan5}}}
	deps, err := a.Departures(ctx, map[string][]Held{"n5": held5}, t0)
	if err != nil || len(deps) != 1 || deps[0].Node != "n5" {
		t.Fatalf("departures with n5 holding %s: %+v, %v", lan5, deps, err)
	}
	if _, err := cli.Delete(ctx, lan5); err != nil {
		t.Fatal(err)
	}
	if subnets, won, err := a.Reclaim(ctx, deps[0], grace, t0.Add(time.Hour), nil); err != nil || won {
		t.Fatalf("reclaim of n5 with nothing left: won %v (subnets %v), %v", won, subnets, err)
	}
	if resp, err := cli.Get(ctx, a.DepartedPrefix()+"n5"); err != nil || resp.Count != 0 {
		t.Fatalf("the marker of n5, which holds nothing any more, is left (%v)", err)
	}
}
