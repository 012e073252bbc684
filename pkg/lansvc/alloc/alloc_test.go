package alloc_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/pkg/ipam/allocator"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/ipam/store/etcd"
	"github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/lansvc/alloc"
)

// sets parses Service ranges as netconf does (ipam/config's syntax).
func sets(t *testing.T, ranges string) []config.RangeSet {
	t.Helper()
	_, s, err := config.ParseRanges([]byte(`{"ranges":` + ranges + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const dual = `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.242"}],[{"subnet":"fd00:50::/64","rangeStart":"fd00:50::10","rangeEnd":"fd00:50::11"}]]`

func diskStore(t *testing.T, dir string) store.Store {
	t.Helper()
	s, err := disk.New(disk.Options{DataDir: dir, Network: "lan"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func etcdStore(t *testing.T, srv *etcdtest.Server, node string) store.Store {
	t.Helper()
	c := srv.ClientConfig()
	s, err := etcd.New(etcd.Options{Endpoints: c.Endpoints, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, Network: "lan", NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// The rules, on the disk store: first free per family, a pod's address
// skipped, requested addresses exact or refused, exhaustion typed,
// release, and the IPAM GC leaving Service owners alone.
func TestEnsureDisk(t *testing.T) {
	ctx := context.Background()
	st := diskStore(t, t.TempDir())
	a := &alloc.Allocator{Store: st, Sets: sets(t, dual)}
	pod := store.Owner{ContainerID: "abc123", IfName: "net1"}
	if ok, err := st.Claim(ctx, store.Claim{IP: netip.MustParseAddr("192.168.50.240"), Owner: pod}); !ok || err != nil {
		t.Fatalf("pod claim: %v %v", ok, err)
	}
	web := alloc.ServiceOwner("home", "web")
	got, err := a.Ensure(ctx, alloc.Request{Owner: web})
	if err != nil || fmt.Sprint(got) != fmt.Sprint(addrs("192.168.50.241", "fd00:50::10")) {
		t.Fatalf("Ensure(web) = %v, %v; want the first free of each family, past the pod's", got, err)
	}
	// Idempotent.
	if again, err := a.Ensure(ctx, alloc.Request{Owner: web}); err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
		t.Fatalf("Ensure(web) again = %v, %v; want %v", again, err, got)
	}
	// The pod's address and web's are taken; outside is outside.
	for _, tc := range []struct {
		ip   string
		kind alloc.Kind
	}{{"192.168.50.240", alloc.Taken}, {"192.168.50.241", alloc.Taken}, {"192.168.50.100", alloc.Outside}, {"fd00:50::99", alloc.Outside}} {
		_, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner("home", "other"), Families: []int{family(tc.ip)}, Addrs: addrs(tc.ip)})
		if !alloc.IsKind(err, tc.kind) {
			t.Errorf("requesting %s: %v; want kind %d", tc.ip, err, tc.kind)
		}
	}
	// A free requested address is given exactly.
	if got, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner("home", "dns"), Families: []int{4}, Addrs: addrs("192.168.50.242")}); err != nil || fmt.Sprint(got) != "[192.168.50.242]" {
		t.Fatalf("requested .242 = %v, %v", got, err)
	}
	// IPv4 is now full.
	if _, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner("home", "x"), Families: []int{4}}); !alloc.IsKind(err, alloc.Exhausted) {
		t.Fatalf("full pool: %v; want Exhausted", err)
	}
	// The runtime's GC (no valid attachment) keeps the Services' addresses.
	gc := &allocator.Allocator{Store: st, Network: "lan"}
	released, err := gc.GC(ctx, nil)
	if err != nil || len(released) != 1 || released[0].Owner != pod {
		t.Fatalf("IPAM GC released %v, %v; want only the pod's", released, err)
	}
	// Release frees; the address can be taken again.
	if rel, err := a.Release(ctx, web); err != nil || len(rel) != 2 {
		t.Fatalf("Release(web) = %v, %v", rel, err)
	}
	if got, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner("home", "x"), Families: []int{4}, Addrs: addrs("192.168.50.241")}); err != nil || fmt.Sprint(got) != "[192.168.50.241]" {
		t.Fatalf("after release = %v, %v", got, err)
	}
	// Dropping a family releases its address.
	if got, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner("home", "dns"), Families: []int{6}}); err != nil || fmt.Sprint(got) != "[fd00:50::10]" {
		t.Fatalf("dns to IPv6 only = %v, %v", got, err)
	}
	owners, err := a.Owners(ctx)
	if err != nil || len(owners) != 2 || len(owners[alloc.ServiceOwner("home", "dns")]) != 1 {
		t.Fatalf("Owners = %v, %v", owners, err)
	}
}

// Holds is Ensure's fixed point: true exactly when Ensure would change
// nothing.
func TestHolds(t *testing.T) {
	a := &alloc.Allocator{Sets: sets(t, dual)}
	for _, tc := range []struct {
		held string
		fams []int
		req  string
		want bool
	}{
		{"192.168.50.240 fd00:50::10", nil, "", true},
		{"192.168.50.240", nil, "", false},
		{"192.168.50.240", []int{4}, "", true},
		{"192.168.50.240", []int{4}, "192.168.50.240", true},
		{"192.168.50.240", []int{4}, "192.168.50.241", false},
		{"192.168.50.240 192.168.50.241", []int{4, 6}, "", false},
		{"192.168.50.99", []int{4}, "", false}, // outside the ranges now
		{"", []int{4}, "", false},
		{"fd00:50::10", []int{6}, "", true},
	} {
		var held, req []netip.Addr
		if tc.held != "" {
			held = addrs(strings.Fields(tc.held)...)
		}
		if tc.req != "" {
			req = addrs(tc.req)
		}
		if got := a.Holds(held, alloc.Request{Families: tc.fams, Addrs: req}); got != tc.want {
			t.Errorf("Holds(%s, %v, %s) = %v", tc.held, tc.fams, tc.req, got)
		}
	}
}

func family(s string) int {
	if netip.MustParseAddr(s).Is4() {
		return 4
	}
	return 6
}

func TestShareKey(t *testing.T) {
	for k, ok := range map[string]bool{"web": true, "a.b-c": true, "": false, "a_b": false, "-a": false, "a/b": false, string(make([]byte, 64)): false} {
		if err := alloc.CheckShareKey(k); (err == nil) != ok {
			t.Errorf("CheckShareKey(%q) = %v", k, err)
		}
	}
	if alloc.ShareOwner("a", "k") == alloc.ServiceOwner("a", "k") {
		t.Fatal("a share group and a Service of the same name have one owner")
	}
	if err := store.ValidateOwner(alloc.ServiceOwner("kube-system", "x")); err != nil {
		t.Fatal(err)
	}
}

// Agents racing on the same Services over one real store end with one
// address per Service, and distinct Services never share one.
func TestRace(t *testing.T) {
	srv := etcdtest.Start(t)
	api := kubetest.Start(t, kubetest.Options{})
	for name, open := range map[string]func(t *testing.T, i int) store.Store{
		"disk": func() func(t *testing.T, i int) store.Store {
			dir := t.TempDir()
			return func(t *testing.T, i int) store.Store { return diskStore(t, dir) }
		}(),
		"etcd": func(t *testing.T, i int) store.Store { return etcdStore(t, srv, fmt.Sprintf("node%d", i)) },
		"kubernetes": func(t *testing.T, i int) store.Store {
			s, err := kube.New(kube.Options{Client: api.Client, Namespace: "default", Network: "lan", NodeName: fmt.Sprintf("node%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			const agents, services = 4, 6
			ranges := `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.230"}]]`
			var allocs []*alloc.Allocator
			for i := range agents {
				allocs = append(allocs, &alloc.Allocator{Store: open(t, i), Sets: sets(t, ranges)})
			}
			for round := range 5 {
				var wg sync.WaitGroup
				results := make([][]string, agents)
				for i, a := range allocs {
					wg.Go(func() {
						for s := range services {
							got, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner(fmt.Sprint("r", round), fmt.Sprint("s", s))})
							if err != nil {
								t.Errorf("agent %d: %v", i, err)
								return
							}
							results[i] = append(results[i], fmt.Sprint(got))
						}
					})
				}
				wg.Wait()
				owners, err := allocs[0].Owners(ctx)
				if err != nil {
					t.Fatal(err)
				}
				seen := map[netip.Addr]bool{}
				for s := range services {
					held := owners[alloc.ServiceOwner(fmt.Sprint("r", round), fmt.Sprint("s", s))]
					if len(held) != 1 {
						t.Fatalf("round %d: service s%d holds %v; want one address", round, s, held)
					}
					if seen[held[0]] {
						t.Fatalf("round %d: %s given twice", round, held[0])
					}
					seen[held[0]] = true
					// Every agent converges on it (an agent that lost the
					// race may have returned its own claim before it was
					// released: it reads the store again).
					for i, a := range allocs {
						got, err := a.Ensure(ctx, alloc.Request{Owner: alloc.ServiceOwner(fmt.Sprint("r", round), fmt.Sprint("s", s))})
						if err != nil || len(got) != 1 || got[0] != held[0] {
							t.Fatalf("round %d: agent %d ensures %v, %v; the store holds %v", round, i, got, err, held)
						}
					}
				}
			}
		})
	}
}
