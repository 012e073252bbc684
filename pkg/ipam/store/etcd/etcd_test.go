package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/pkg/etcdclient"
	"github.com/village-cni/village/pkg/ipam/allocator"
	"github.com/village-cni/village/pkg/ipam/allocator/stickytest"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/storetest"
)

var ctx = context.Background()

var netSeq atomic.Int64

// open makes a store on srv; an empty network gets a fresh one.
func open(t *testing.T, srv *etcdtest.Server, o Options) *Store {
	t.Helper()
	c := srv.ClientConfig()
	o.Endpoints, o.CAFile, o.CertFile, o.KeyFile = c.Endpoints, c.CAFile, c.CertFile, c.KeyFile
	if o.Network == "" {
		o.Network = fmt.Sprintf("net%d", netSeq.Add(1))
	}
	if o.NodeName == "" {
		o.NodeName = "node1"
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustClaim(t *testing.T, s *Store, ip string, o store.Owner) bool {
	t.Helper()
	ok, err := s.Claim(ctx, store.Claim{IP: netip.MustParseAddr(ip), Owner: o})
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func listIPs(t *testing.T, s *Store) string {
	t.Helper()
	all, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range all {
		out = append(out, a.IP.String()+"="+a.Owner.ContainerID)
	}
	return strings.Join(out, " ")
}

var (
	ownerA = store.Owner{ContainerID: "ctr-a", IfName: "eth0"}
	ownerB = store.Owner{ContainerID: "ctr-b", IfName: "net1"}
)

func TestConformance(t *testing.T) {
	srv := etcdtest.Start(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, srv, Options{}) })
}

// TestSticky runs the allocator's sticky-address suite over two nodes'
// stores of one network.
func TestSticky(t *testing.T) {
	srv := etcdtest.Start(t)
	var network string
	stickytest.Run(t, func(t *testing.T, node string) store.Store {
		if node == "a" {
			network = fmt.Sprintf("net%d", netSeq.Add(1))
		}
		return open(t, srv, Options{Network: network, NodeName: node})
	})
}

func TestKeyLayout(t *testing.T) {
	srv := etcdtest.Start(t)
	s := open(t, srv, Options{Prefix: "/lab/", Network: "lan", NodeName: "n7"})
	if _, err := s.Claim(ctx, store.Claim{IP: netip.MustParseAddr("::ffff:192.168.50.200"), Owner: ownerA, RangeSet: 2}); err != nil {
		t.Fatal(err)
	}
	cli, err := etcdclient.New(srv.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/", withPrefix()...)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	rec := got["/lab/ipam/lan/ips/192.168.50.200"]
	want := map[string]string{
		"/lab/ipam/lan/ips/192.168.50.200":               rec,
		"/lab/ipam/lan/owners/ctr-a/eth0/192.168.50.200": "",
		"/lab/ipam/lan/last/2":                           "192.168.50.200",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("keys %v, want %v", got, want)
	}
	for _, part := range []string{`"containerID":"ctr-a"`, `"ifName":"eth0"`, `"node":"n7"`, `"time":"20`} {
		if !strings.Contains(rec, part) {
			t.Errorf("record %s lacks %s", rec, part)
		}
	}
	if s.Base() != "/lab/ipam/lan/" || s.Node() != "n7" {
		t.Errorf("Base %q Node %q", s.Base(), s.Node())
	}
}

// TestConcurrentNodesNeverShareAnAddress runs three nodes (separate stores,
// separate clients), each with eight goroutines allocating through the real
// allocator from one 60-address pool until it is exhausted, while every
// goroutine also races for a set of contested addresses.
func TestConcurrentNodesNeverShareAnAddress(t *testing.T) {
	srv := etcdtest.Start(t)
	c, err := config.Parse([]byte(`{"cniVersion":"1.1.0","name":"lan","ipam":{"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.190","rangeEnd":"192.168.50.249"}]]}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	const nodes, workers, pool = 3, 8, 60
	var mu sync.Mutex
	holder := map[netip.Addr]string{}
	var dup []string
	contested := map[netip.Addr]int{}
	var wg sync.WaitGroup
	for n := range nodes {
		s := open(t, srv, Options{Network: "lan", NodeName: fmt.Sprintf("node%d", n)})
		a := &allocator.Allocator{Store: s, Network: "lan", RangeSets: c.RangeSets}
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					o := store.Owner{ContainerID: fmt.Sprintf("n%d-w%d-%d", n, w, i), IfName: "net1"}
					// Race for the same 4 addresses outside the pool.
					for k := range 4 {
						ip := netip.AddrFrom4([4]byte{10, 9, 0, byte(k)})
						if ok, err := s.Claim(ctx, store.Claim{IP: ip, Owner: o}); err != nil {
							t.Error(err)
						} else if ok {
							mu.Lock()
							contested[ip]++
							mu.Unlock()
						}
					}
					as, err := a.Allocate(ctx, allocator.Request{Owner: o})
					var ex *allocator.ExhaustedError
					if errors.As(err, &ex) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if prev, ok := holder[as[0].IP]; ok {
						dup = append(dup, fmt.Sprintf("%s to %s and %s", as[0].IP, prev, o.ContainerID))
					}
					holder[as[0].IP] = o.ContainerID
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if len(dup) > 0 {
		t.Fatalf("addresses handed out twice: %v", dup)
	}
	if len(holder) != pool {
		t.Fatalf("%d addresses handed out, want the whole pool of %d", len(holder), pool)
	}
	for k := range 4 {
		if n := contested[netip.AddrFrom4([4]byte{10, 9, 0, byte(k)})]; n != 1 {
			t.Errorf("contested address %d claimed %d times", k, n)
		}
	}
	// What etcd holds is exactly what was handed out.
	s := open(t, srv, Options{Network: "lan"})
	all, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != pool+4 {
		t.Fatalf("List has %d allocations, want %d", len(all), pool+4)
	}
	for _, al := range all {
		if want, ok := holder[al.IP]; ok && al.Owner.ContainerID != want {
			t.Errorf("%s recorded for %s, handed to %s", al.IP, al.Owner.ContainerID, want)
		}
		// The owner index agrees with the records.
		got, err := s.ListByOwner(ctx, al.Owner)
		if err != nil || !slices.Contains(got, al.IP) {
			t.Errorf("ListByOwner(%v) = %v, %v; missing %s", al.Owner, got, err, al.IP)
		}
	}
}

func TestReleaseChecksOwnerAcrossNodes(t *testing.T) {
	srv := etcdtest.Start(t)
	n1 := open(t, srv, Options{Network: "lan", NodeName: "node1"})
	n2 := open(t, srv, Options{Network: "lan", NodeName: "node2"})
	mustClaim(t, n1, "192.168.50.200", ownerA)
	ip := netip.MustParseAddr("192.168.50.200")
	if ok, err := n2.Release(ctx, ip, ownerB); ok || err != nil {
		t.Fatalf("Release by another owner = %v, %v", ok, err)
	}
	if ok, err := n2.Release(ctx, ip, store.Owner{ContainerID: "ctr-a", IfName: "net1"}); ok || err != nil {
		t.Fatalf("Release by the same container, other interface = %v, %v", ok, err)
	}
	// The owner's DEL may come through any store instance.
	if ok, err := n2.Release(ctx, ip, ownerA); !ok || err != nil {
		t.Fatalf("Release by the owner = %v, %v", ok, err)
	}
	if got, _ := n1.ListByOwner(ctx, ownerA); len(got) != 0 {
		t.Fatalf("owner index still lists %v", got)
	}
	// Released and claimed by B: a late release by A must not free it.
	mustClaim(t, n2, "192.168.50.200", ownerB)
	if ok, err := n1.Release(ctx, ip, ownerA); ok || err != nil {
		t.Fatalf("stale Release = %v, %v", ok, err)
	}
	if got := listIPs(t, n1); got != "192.168.50.200=ctr-b" {
		t.Fatalf("after stale release: %s", got)
	}
}

func TestReleaseIsRevisionChecked(t *testing.T) {
	srv := etcdtest.Start(t)
	s := open(t, srv, Options{})
	mustClaim(t, s, "10.0.0.5", ownerA)
	ip := netip.MustParseAddr("10.0.0.5")
	cli, err := etcdclient.New(srv.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, s.ipKey(ip))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(resp, err)
	}
	rev := resp.Kvs[0].ModRevision
	// Between reading and deleting, the address is released and given to B.
	if ok, _ := s.Release(ctx, ip, ownerA); !ok {
		t.Fatal("release failed")
	}
	mustClaim(t, s, "10.0.0.5", ownerB)
	if ok, err := s.delete(ctx, ip, ownerA, rev); ok || err != nil {
		t.Fatalf("delete at a stale revision = %v, %v", ok, err)
	}
	if got := listIPs(t, s); got != "10.0.0.5=ctr-b" {
		t.Fatalf("after stale delete: %s", got)
	}
}

func TestGCIsScopedToTheNode(t *testing.T) {
	srv := etcdtest.Start(t)
	n1 := open(t, srv, Options{Network: "lan", NodeName: "node1"})
	n2 := open(t, srv, Options{Network: "lan", NodeName: "node2"})
	keep := store.Owner{ContainerID: "keep", IfName: "eth0"}
	mustClaim(t, n1, "10.0.0.1", ownerA)
	mustClaim(t, n1, "10.0.0.2", keep)
	mustClaim(t, n2, "10.0.0.3", ownerB)
	mustClaim(t, n2, "10.0.0.4", store.Owner{ContainerID: "n2-pod", IfName: "eth0"})
	released, err := n1.GC(ctx, store.Valid([]store.Owner{keep}))
	if err != nil {
		t.Fatal(err)
	}
	if len(released) != 1 || released[0].IP != netip.MustParseAddr("10.0.0.1") || released[0].Owner != ownerA {
		t.Fatalf("node1 GC released %v, want only 10.0.0.1 of ctr-a", released)
	}
	if got := listIPs(t, n2); got != "10.0.0.2=keep 10.0.0.3=ctr-b 10.0.0.4=n2-pod" {
		t.Fatalf("after node1's GC: %s", got)
	}
	released, err = n2.GC(ctx, store.Valid(nil))
	if err != nil || len(released) != 2 {
		t.Fatalf("node2 GC(nil) = %v, %v; want its two", released, err)
	}
	if got := listIPs(t, n1); got != "10.0.0.2=keep" {
		t.Fatalf("after node2's GC: %s", got)
	}
}

func TestLastReservedIsSharedByNodes(t *testing.T) {
	srv := etcdtest.Start(t)
	n1 := open(t, srv, Options{Network: "lan", NodeName: "node1"})
	n2 := open(t, srv, Options{Network: "lan", NodeName: "node2"})
	mustClaim(t, n1, "192.168.50.201", ownerA)
	if got, err := n2.LastReserved(ctx, 0); err != nil || got != netip.MustParseAddr("192.168.50.201") {
		t.Fatalf("node2 LastReserved = %v, %v", got, err)
	}
	if ok := mustClaim(t, n2, "192.168.50.201", ownerB); ok {
		t.Fatal("double claim")
	}
	// A refused claim does not move the marker.
	if got, _ := n1.LastReserved(ctx, 0); got != netip.MustParseAddr("192.168.50.201") {
		t.Fatalf("LastReserved = %v after a refused claim", got)
	}
}

func TestPrefixesAndNetworksAreApart(t *testing.T) {
	srv := etcdtest.Start(t)
	stores := []*Store{
		open(t, srv, Options{Prefix: "/a", Network: "n"}),
		open(t, srv, Options{Prefix: "/ab", Network: "n"}),
		open(t, srv, Options{Prefix: "/a", Network: "n2"}),
		open(t, srv, Options{Prefix: "/a/ipam/n", Network: "x"}), // nested under another's prefix
		open(t, srv, Options{Network: "n"}),                      // default prefix
	}
	for i, s := range stores {
		o := store.Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}
		if !mustClaim(t, s, "10.0.0.2", o) {
			t.Fatalf("store %d (%s) could not claim an address only others hold", i, s.Base())
		}
	}
	for i, s := range stores {
		if got, want := listIPs(t, s), fmt.Sprintf("10.0.0.2=c%d", i); got != want {
			t.Errorf("store %d (%s) lists %s, want %s", i, s.Base(), got, want)
		}
		rel, err := s.GC(ctx, store.Valid(nil))
		if err != nil || len(rel) != 1 {
			t.Errorf("store %d GC = %v, %v", i, rel, err)
		}
	}
}

func TestValidation(t *testing.T) {
	ep := []string{"http://127.0.0.1:1"}
	for _, o := range []Options{
		{Endpoints: ep, Network: ""},
		{Endpoints: ep, Network: "../x"},
		{Endpoints: ep, Network: "a/b"},
		{Endpoints: ep, Network: "n", Prefix: "village"},
		{Endpoints: ep, Network: "n", Prefix: "/a//b"},
		{Endpoints: ep, Network: "n", Prefix: "/a/../b"},
		{Endpoints: ep, Network: "n", Prefix: "/a b"},
		{Endpoints: ep, Network: "n", NodeName: "node/1"},
		{Endpoints: ep, Network: "n", NodeName: "-x"},
		{Network: "n", NodeName: "x"},
	} {
		if s, err := New(o); err == nil {
			s.Close()
			t.Errorf("New(%+v) succeeded", o)
		}
	}
	for in, want := range map[string]string{"": "/village", "/": "", "/x/": "/x", "/a/b.c_d-e": "/a/b.c_d-e"} {
		if got, err := CleanPrefix(in); err != nil || got != want {
			t.Errorf("CleanPrefix(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	s, err := New(Options{Endpoints: ep, Network: "n", NodeName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Rejected before any call to etcd (none listens at ep).
	for _, c := range []store.Claim{
		{IP: netip.MustParseAddr("10.0.0.1"), Owner: store.Owner{ContainerID: "a/b", IfName: "eth0"}},
		{IP: netip.MustParseAddr("10.0.0.1"), Owner: store.Owner{ContainerID: "a", IfName: "et/h0"}},
		{IP: netip.MustParseAddr("10.0.0.1"), Owner: store.Owner{ContainerID: "a", IfName: ""}},
		{IP: netip.MustParseAddr("fe80::1%eth0"), Owner: ownerA},
		{IP: netip.Addr{}, Owner: ownerA},
		{IP: netip.MustParseAddr("10.0.0.1"), Owner: ownerA, RangeSet: -1},
	} {
		if _, err := s.Claim(ctx, c); err == nil || strings.Contains(err.Error(), "unreachable") {
			t.Errorf("Claim(%+v) = %v; want a validation error", c, err)
		}
	}
	if _, err := s.ListByOwner(ctx, store.Owner{ContainerID: "a/b", IfName: "eth0"}); err == nil {
		t.Error("ListByOwner accepted a container ID with '/'")
	}
}

func deadEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// checkUnreachable runs every operation and checks each fails because its
// deadline fired (DeadlineExceeded, described as unreachable after timeout)
// with an error naming the endpoint. No duration is asserted: the 60 s bound
// only guards against a hang.
func checkUnreachable(t *testing.T, s *Store, ep string, timeout time.Duration) {
	t.Helper()
	ip := netip.MustParseAddr("10.0.0.2")
	ops := map[string]func() error{
		"Claim":        func() error { _, err := s.Claim(ctx, store.Claim{IP: ip, Owner: ownerA}); return err },
		"Release":      func() error { _, err := s.Release(ctx, ip, ownerA); return err },
		"ListByOwner":  func() error { _, err := s.ListByOwner(ctx, ownerA); return err },
		"List":         func() error { _, err := s.List(ctx); return err },
		"LastReserved": func() error { _, err := s.LastReserved(ctx, 0); return err },
		"GC":           func() error { _, err := s.GC(ctx, store.Valid(nil)); return err },
	}
	var wg sync.WaitGroup
	for name, op := range ops {
		wg.Go(func() {
			err := op()
			if err == nil {
				t.Errorf("%s succeeded with etcd down", name)
				return
			}
			want := fmt.Sprintf("etcd at [%s] unreachable after %s", ep, timeout)
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s error %v, want its deadline to fire (%q)", name, err, want)
			}
		})
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatal("operations against an unreachable etcd still running after 60s")
	}
}

func TestUnreachableFailsInBoundedTime(t *testing.T) {
	ep := deadEndpoint(t)
	s, err := New(Options{Endpoints: []string{ep}, Network: "n", NodeName: "x", OpTimeout: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkUnreachable(t, s, ep, 700*time.Millisecond)
}

// TestCallerDeadlineWins: with an operation timeout of ten minutes, the
// caller's 200 ms deadline is what ends List; returning within the 60 s hang
// guard proves it.
func TestCallerDeadlineWins(t *testing.T) {
	ep := deadEndpoint(t)
	s, err := New(Options{Endpoints: []string{ep}, Network: "n", NodeName: "x", OpTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := s.List(cctx); done <- err }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("List with a 200ms caller deadline still running after 60s")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "etcd at ["+ep+"]") {
		t.Fatalf("List with a 200ms deadline: %v, want DeadlineExceeded naming %s", err, ep)
	}
}

func TestEtcdDownThenBack(t *testing.T) {
	srv := etcdtest.Start(t)
	s := open(t, srv, Options{Network: "lan", OpTimeout: time.Second})
	mustClaim(t, s, "10.0.0.2", ownerA)
	srv.Stop()
	checkUnreachable(t, s, srv.Endpoints[0], time.Second)
	srv.Restart()
	fresh := open(t, srv, Options{Network: "lan"})
	if got := listIPs(t, fresh); got != "10.0.0.2=ctr-a" {
		t.Fatalf("after restart a fresh store lists %q", got)
	}
	if !mustClaim(t, fresh, "10.0.0.3", ownerB) || mustClaim(t, fresh, "10.0.0.2", ownerB) {
		t.Fatal("claims after restart went wrong")
	}
	// The long-lived store reconnects too (gRPC backs off, so allow time).
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := s.ListByOwner(ctx, ownerB)
		if err == nil {
			if len(got) != 1 {
				t.Fatalf("old store ListByOwner = %v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store made before the restart still fails: %v", err)
		}
	}
}

func TestTLS(t *testing.T) {
	srv := etcdtest.StartTLS(t)
	s := open(t, srv, Options{})
	if !mustClaim(t, s, "10.0.0.2", ownerA) {
		t.Fatal("claim over TLS refused")
	}
	c := srv.ClientConfig()
	bad, err := New(Options{Endpoints: c.Endpoints, CAFile: srv.TLS.OtherCAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Network: "n", NodeName: "x", OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Claim(ctx, store.Claim{IP: netip.MustParseAddr("10.0.0.3"), Owner: ownerA})
	if err == nil || !strings.Contains(err.Error(), "x509") || !strings.Contains(err.Error(), c.Endpoints[0]) {
		t.Fatalf("wrong CA: %v; want an x509 error naming %s", err, c.Endpoints[0])
	}
	t.Log(err)
	if _, err := New(Options{Endpoints: c.Endpoints, CAFile: "/nonexistent/ca.pem", Network: "n", NodeName: "x"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Fatalf("missing CA file: %v", err)
	}
}

func withPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }

// TestDepartedNodeKeepsNoService: what a departed node's reclaim may
// release (AllocationsByNode, pkg/agent's reclaimer) holds that node's pod
// addresses but never a LAN Service's address it happened to write: the
// Service stays at its address however long the node stays away.
func TestDepartedNodeKeepsNoService(t *testing.T) {
	srv := etcdtest.Start(t)
	n1 := open(t, srv, Options{Network: "lan", NodeName: "node1"})
	svc := store.Owner{ContainerID: store.ServiceOwnerPrefix + "home_web", IfName: "svc"}
	mustClaim(t, n1, "192.168.50.240", svc)
	mustClaim(t, n1, "192.168.50.200", ownerA)
	byNode, err := AllocationsByNode(ctx, n1.cli, "", "lan")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range byNode["node1"] {
		got = append(got, a.IP.String())
	}
	if strings.Join(got, " ") != "192.168.50.200" || len(byNode) != 1 {
		t.Fatalf("a departed node1 would take %v with it (all: %v), want only its pod's 192.168.50.200", got, byNode)
	}
}
