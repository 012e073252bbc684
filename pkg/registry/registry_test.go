package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/pkg/etcdclient"
)

func newRegistry(t *testing.T, srv *etcdtest.Server, ttl time.Duration) (*Registry, *clientv3.Client) {
	t.Helper()
	cfg := srv.ClientConfig()
	cli, err := etcdclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	r, err := New(cli, Config{Etcd: cfg, Prefix: "/village/", Network: "ovl", TTL: ttl, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return r, cli
}

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func TestSubnetSpace(t *testing.T) {
	s, err := NewSubnetSpace(cidr("10.244.0.0/16"), 24)
	if err != nil {
		t.Fatal(err)
	}
	if s.Count() != 256 || s.Nth(0).String() != "10.244.0.0/24" || s.Nth(3).String() != "10.244.3.0/24" || s.Nth(255).String() != "10.244.255.0/24" {
		t.Fatalf("space: count %d, %s %s %s", s.Count(), s.Nth(0), s.Nth(3), s.Nth(255))
	}
	s6, err := NewSubnetSpace(cidr("fd00:10::/48"), 64)
	if err != nil {
		t.Fatal(err)
	}
	if got := s6.Nth(5).String(); got != "fd00:10:0:5::/64" {
		t.Fatalf("v6 Nth(5) = %s", got)
	}
	for _, bad := range []struct {
		c    string
		bits int
	}{{"10.244.0.0/16", 16}, {"10.244.0.0/16", 31}, {"fd00::/48", 24}, {"fd00::/48", 127}} {
		if _, err := NewSubnetSpace(cidr(bad.c), bad.bits); err == nil || !strings.Contains(err.Error(), "subnetLen") {
			t.Errorf("%s /%d: %v, want an error naming subnetLen", bad.c, bad.bits, err)
		}
	}
	if _, err := NewSubnetSpace(nil, 24); err == nil || !strings.Contains(err.Error(), "clusterCIDR") {
		t.Errorf("nil cluster: %v", err)
	}
}

// Many nodes on their own clients lease at once: every node gets a subnet,
// no two the same, and asking again returns the same one.
func TestConcurrentSubnetLeasesNeverDuplicate(t *testing.T) {
	srv := etcdtest.Start(t)
	space, err := NewSubnetSpace(cidr("10.60.0.0/20"), 24) // 16 subnets
	if err != nil {
		t.Fatal(err)
	}
	const clients, perClient = 4, 4 // 16 nodes: every subnet, exactly
	regs := make([]*Registry, clients)
	for i := range regs {
		regs[i], _ = newRegistry(t, srv, 10*time.Second)
	}
	got := make([]netip.Prefix, clients*perClient)
	errs := make([]error, len(got))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range got {
		wg.Go(func() {
			<-start
			got[i], errs[i] = regs[i%clients].LeaseSubnet(context.Background(), space, fmt.Sprintf("node%02d", i))
		})
	}
	close(start)
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i, p := range got {
		if errs[i] != nil {
			t.Fatalf("node%02d: %v", i, errs[i])
		}
		if j, dup := seen[p]; dup {
			t.Fatalf("node%02d and node%02d both got %s", j, i, p)
		}
		seen[p] = i
		if !space.Contains(p) {
			t.Fatalf("node%02d got %s outside %s", i, p, space.Cluster)
		}
	}
	// Stable: the same node gets the same subnet again (a restart).
	for i := range got {
		p, err := regs[(i+1)%clients].LeaseSubnet(context.Background(), space, fmt.Sprintf("node%02d", i))
		if err != nil || p != got[i] {
			t.Fatalf("node%02d again: %s, %v; want %s", i, p, err, got[i])
		}
	}
	// Full: a new node gets a clear error.
	_, err = regs[0].LeaseSubnet(context.Background(), space, "late")
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "10.60.0.0/20") {
		t.Fatalf("lease past exhaustion: %v", err)
	}
	// Released, it is free again; only its holder can release it.
	if err := regs[0].ReleaseSubnet(context.Background(), got[0], "someone-else"); err == nil {
		t.Fatal("a node released another node's subnet")
	}
	if err := regs[0].ReleaseSubnet(context.Background(), got[0], "node00"); err != nil {
		t.Fatal(err)
	}
	if p, err := regs[0].LeaseSubnet(context.Background(), space, "late"); err != nil || p != got[0] {
		t.Fatalf("after release: %s, %v; want %s", p, err, got[0])
	}
}

func TestLeaseOrderSkipsNetworkSubnetFirst(t *testing.T) {
	srv := etcdtest.Start(t)
	r, _ := newRegistry(t, srv, 10*time.Second)
	space, _ := NewSubnetSpace(cidr("10.61.0.0/23"), 24)
	a, err := r.LeaseSubnet(context.Background(), space, "a")
	if err != nil || a.String() != "10.61.1.0/24" {
		t.Fatalf("first lease %s, %v; want 10.61.1.0/24", a, err)
	}
	b, err := r.LeaseSubnet(context.Background(), space, "b")
	if err != nil || b.String() != "10.61.0.0/24" {
		t.Fatalf("second lease %s, %v; want 10.61.0.0/24", b, err)
	}
	if p, ok, err := r.HeldSubnet(context.Background(), space, "b"); err != nil || !ok || p != b {
		t.Fatalf("HeldSubnet(b) = %s %v %v", p, ok, err)
	}
}

// reader is what a Feed's reader knows: the batches applied in turn.
type reader struct {
	feed  *Feed
	nodes map[string]Node
}

func newReader() *reader { return &reader{feed: NewFeed(), nodes: map[string]Node{}} }

// next takes batches until want accepts the node list (sorted); 60 s only
// guards against a hang.
func (r *reader) next(t *testing.T, want func([]Node) bool) []Node {
	t.Helper()
	const within = time.Minute
	deadline := time.After(within)
	for {
		select {
		case <-r.feed.Ready():
			b, ok := r.feed.Take()
			if !ok {
				continue
			}
			b.ApplyTo(r.nodes)
			list := slices.SortedFunc(maps.Values(r.nodes), func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
			if want(list) {
				return list
			}
		case <-deadline:
			t.Fatalf("no wanted node list within %s; last: %+v", within, r.nodes)
		}
	}
}

func names(nodes []Node) string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return strings.Join(out, ",")
}

// Follow sees a node appear, change, and disappear when its lease expires
// (nobody keeps it alive), and a refreshed node stay. The node that stays has
// a lease of a minute, so that a loaded machine delaying its refreshes by
// seconds cannot expire it; the node that goes has etcd's shortest lease
// (2 s), and the test waits for its expiry, however late, not for a time.
func TestFollowSeesAddChangeAndExpiry(t *testing.T) {
	srv := etcdtest.Start(t)
	r, _ := newRegistry(t, srv, time.Minute)
	short, _ := newRegistry(t, srv, 2*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rd := newReader()
	done := make(chan error, 1)
	go func() { done <- r.Follow(ctx, rd.feed, t.Logf) }()
	rd.next(t, func(s []Node) bool { return len(s) == 0 })

	a := Node{Name: "a", IP: "192.168.1.1", PodCIDRs: []string{"10.1.1.0/24"}, VtepMAC: "0e:76:c0:a8:01:01"}
	ga, err := r.Register(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	b := Node{Name: "b", IP: "192.168.1.2", PodCIDRs: []string{"10.1.2.0/24"}}
	if _, err := short.Register(ctx, b); err != nil {
		t.Fatal(err)
	}
	rd.next(t, func(s []Node) bool { return names(s) == "a,b" })

	a.IP = "192.168.1.11"
	if err := ga.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	rd.next(t, func(s []Node) bool { return len(s) > 0 && s[0].IP == "192.168.1.11" })

	// a is refreshed, b is not: b expires.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if _, err := ga.Refresh(ctx); err != nil {
					t.Errorf("refresh: %v", err)
				}
			}
		}
	})
	s := rd.next(t, func(s []Node) bool { return names(s) == "a" })
	close(stop)
	wg.Wait()
	if !s[0].Equal(a) {
		t.Fatalf("a changed: %+v", s[0])
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow returned %v", err)
	}
}

// A record deleted by hand is written back by the next Refresh; a revoked
// lease is replaced.
func TestRefreshRepairs(t *testing.T) {
	srv := etcdtest.Start(t)
	r, cli := newRegistry(t, srv, 5*time.Second)
	ctx := context.Background()
	n := Node{Name: "a", IP: "192.168.1.1", PodCIDRs: []string{"10.1.1.0/24"}}
	g, err := r.Register(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, r.NodesPrefix()+"a"); err != nil {
		t.Fatal(err)
	}
	if renewed, err := g.Refresh(ctx); err != nil || renewed {
		t.Fatalf("refresh after delete: %v %v", renewed, err)
	}
	if got, ok, err := r.Node(ctx, "a"); err != nil || !ok || !got.Equal(n) {
		t.Fatalf("record after refresh: %+v %v %v", got, ok, err)
	}
	old := g.Lease()
	if _, err := cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if renewed, err := g.Refresh(ctx); err != nil || !renewed || g.Lease() == old {
		t.Fatalf("refresh after revoke: renewed %v, %v, lease %x (old %x)", renewed, err, g.Lease(), old)
	}
	if _, ok, _ := r.Node(ctx, "a"); !ok {
		t.Fatal("record not back after the lease was replaced")
	}
}

func TestBadRecordsAreSkippedAndNamed(t *testing.T) {
	srv := etcdtest.Start(t)
	r, cli := newRegistry(t, srv, 5*time.Second)
	ctx := context.Background()
	if _, err := r.Register(ctx, Node{Name: "good", IP: "192.168.1.1", PodCIDRs: []string{"10.1.1.0/24"}}); err != nil {
		t.Fatal(err)
	}
	cli.Put(ctx, r.NodesPrefix()+"junk", "{not json")
	cli.Put(ctx, r.NodesPrefix()+"liar", `{"name":"other","ip":"192.168.1.9"}`)
	nodes, _, bad, err := r.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "good" {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
	if bad == nil || !strings.Contains(bad.Error(), "junk") || !strings.Contains(bad.Error(), "liar") {
		t.Fatalf("bad records not named: %v", bad)
	}
	for _, n := range []Node{{Name: "a/b", IP: "1.2.3.4"}, {Name: "a", IP: "x"}, {Name: "a", IP: "1.2.3.4", PodCIDRs: []string{"10.0.0.0"}}} {
		if _, err := r.Register(ctx, n); err == nil {
			t.Errorf("registered invalid %+v", n)
		}
	}
}

// Errors name the endpoints when etcd is down, and come back because the
// operation timeout fired (the 60 s bound only guards against a hang).
func TestErrorsNameEndpoints(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := srv.ClientConfig()
	cfg.DialTimeout = time.Second
	cli, err := etcdclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := New(cli, Config{Etcd: cfg, Prefix: "/village", Network: "ovl", TTL: 5 * time.Second, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	space, _ := NewSubnetSpace(cidr("10.0.0.0/16"), 24)
	done := make(chan error, 1)
	go func() { _, err := r.LeaseSubnet(context.Background(), space, "a"); done <- err }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("LeaseSubnet with etcd down still running after 60s")
	}
	t.Logf("lease with etcd down: %v", err)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), srv.Endpoints[0]) {
		t.Fatalf("lease with etcd down: %v, want the 1s timeout to fire (DeadlineExceeded) naming %s", err, srv.Endpoints[0])
	}
}
