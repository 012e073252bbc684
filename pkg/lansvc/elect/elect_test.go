package elect

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func alive(nodes ...string) func(string) bool {
	return func(n string) bool { return slices.Contains(nodes, n) }
}

func TestOwner(t *testing.T) {
	a := netip.MustParseAddr("192.168.1.240")
	all := []string{"n1", "n2", "n3"}
	winner := Owner(a, all, alive(all...))
	if winner == "" {
		t.Fatal("no owner with every node alive")
	}
	var others []string
	for _, n := range all {
		if n != winner {
			others = append(others, n)
		}
	}
	for _, tc := range []struct {
		name     string
		eligible []string
		live     []string
		want     string
	}{
		{"every node alive and eligible", all, all, winner},
		{"the order of eligible nodes does not matter", []string{all[2], all[0], all[1]}, all, winner},
		{"the winner gone: one of the others", all, others, Owner(a, others, alive(others...))},
		{"the winner not eligible", others, all, Owner(a, others, alive(all...))},
		{"no eligible node alive", []string{"n9"}, all, ""},
		{"nobody eligible", nil, all, ""},
		{"an empty name is never an owner", []string{""}, []string{""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Owner(a, tc.eligible, alive(tc.live...)); got != tc.want {
				t.Fatalf("Owner = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDepartureMovesOnlyItsAddresses: when one node leaves, only the
// addresses it owned change owner; when it comes back, they return to it
// and nothing else moves.
func TestDepartureMovesOnlyItsAddresses(t *testing.T) {
	nodes := []string{"node-1", "node-2", "node-3", "node-4"}
	var addrs []netip.Addr
	for i := range 200 {
		addrs = append(addrs, netip.AddrFrom4([4]byte{192, 168, 1, byte(i)}), netip.MustParseAddr(fmt.Sprintf("fd00::%x", i)))
	}
	before := map[netip.Addr]string{}
	count := map[string]int{}
	for _, a := range addrs {
		before[a] = Owner(a, nodes, alive(nodes...))
		count[before[a]]++
	}
	for _, n := range nodes {
		// 400 addresses over 4 nodes: far from all on one.
		if count[n] < 50 {
			t.Errorf("%s owns %d of %d addresses", n, count[n], len(addrs))
		}
	}
	for _, gone := range nodes {
		var rest []string
		for _, n := range nodes {
			if n != gone {
				rest = append(rest, n)
			}
		}
		for _, a := range addrs {
			after := Owner(a, nodes, alive(rest...))
			if before[a] != gone && after != before[a] {
				t.Fatalf("%s left: %s moved from %s to %s", gone, a, before[a], after)
			}
			if after == gone || after == "" {
				t.Fatalf("%s left: %s owned by %q", gone, a, after)
			}
		}
	}
}

// TestEveryAgentAgrees: agents that see the same members compute the
// same owners whatever order they learn nodes and addresses in, so
// exactly one of them claims each address.
func TestEveryAgentAgrees(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	var wants []Want
	for i := range 50 {
		wants = append(wants, Want{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), Eligible: nodes[:1+i%len(nodes)]})
	}
	live := alive("a", "c", "d", "e")
	claims := map[netip.Addr]int{}
	for _, self := range nodes {
		shuffled := slices.Clone(wants)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		for i := range shuffled {
			shuffled[i].Eligible = slices.Clone(shuffled[i].Eligible)
			rand.Shuffle(len(shuffled[i].Eligible), func(x, y int) {
				shuffled[i].Eligible[x], shuffled[i].Eligible[y] = shuffled[i].Eligible[y], shuffled[i].Eligible[x]
			})
		}
		mine := Mine(self, shuffled, live)
		if self == "b" && len(mine) > 0 {
			t.Fatalf("dead node b claims %v", mine)
		}
		for _, a := range mine {
			claims[a]++
		}
	}
	for _, w := range wants {
		want := 1
		if !slices.ContainsFunc(w.Eligible, live) {
			want = 0 // only b eligible, and b is gone
		}
		if claims[w.Addr] != want {
			t.Errorf("%s (eligible %v) claimed %d times, want %d", w.Addr, w.Eligible, claims[w.Addr], want)
		}
	}
}

func FuzzOwnerIsEligibleAndLive(f *testing.F) {
	f.Add("n1", "n2", "n3", []byte{192, 168, 0, 1}, uint8(5))
	f.Fuzz(func(t *testing.T, n1, n2, n3 string, ip []byte, liveMask uint8) {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			return
		}
		nodes := []string{n1, n2, n3}
		var live []string
		for i, n := range nodes {
			if liveMask&(1<<i) != 0 {
				live = append(live, n)
			}
		}
		got := Owner(a, nodes, alive(live...))
		if got == "" {
			for _, n := range live {
				if n != "" {
					t.Fatalf("no owner though %q is eligible and alive", n)
				}
			}
			return
		}
		if !slices.Contains(live, got) {
			t.Fatalf("owner %q is not alive (%v)", got, live)
		}
		if again := Owner(a, []string{n3, n1, n2}, alive(live...)); again != got {
			t.Fatalf("owner depends on order: %q vs %q", got, again)
		}
	})
}

// Writer picks one of the nodes, the same whatever their order, and
// spreads keys over them.
func TestWriter(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	count := map[string]int{}
	for i := range 300 {
		key := "svc/ns/s" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		w := Writer(key, nodes)
		if w2 := Writer(key, []string{"c", "a", "b"}); w != w2 {
			t.Fatalf("%s: %q vs %q by order", key, w, w2)
		}
		count[w]++
	}
	for _, n := range nodes {
		if count[n] < 50 {
			t.Fatalf("uneven: %v", count)
		}
	}
	if Writer("k", nil) != "" {
		t.Fatal("a writer among no nodes")
	}
}
