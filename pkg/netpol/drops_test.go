package netpol

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/table"
)

// sendUDP sends n datagrams from netns from to addr:port.
func sendUDP(t *testing.T, from ns.NetNS, addr string, port, n int) {
	t.Helper()
	if err := testenv.SendUDP(from, addr, port, n); err != nil {
		t.Fatal(err)
	}
}

// dropsOf is what chain dropped, as table.Drops reads it in n.
func dropsOf(t *testing.T, n ns.NetNS, network, chain string) table.ChainDrops {
	t.Helper()
	var all []table.ChainDrops
	if err := testenv.InNS(n, func() (err error) { all, err = table.Drops(network); return err }); err != nil {
		t.Fatal(err)
	}
	for _, d := range all {
		if d.Chain == chain {
			return d
		}
	}
	t.Fatalf("no drop counter for chain %s in %+v", chain, all)
	return table.ChainDrops{}
}

// waitDrops waits until chain's counter reads packets, and fails when it
// reads more.
func waitDrops(t *testing.T, n ns.NetNS, network, chain string, packets uint64) table.ChainDrops {
	t.Helper()
	var d table.ChainDrops
	testenv.WaitFor(t, fmt.Sprintf("%s to count %d drops", chain, packets), func() error {
		d = dropsOf(t, n, network, chain)
		if d.Packets > packets {
			t.Fatalf("%s counts %d drops, more than the %d sent", chain, d.Packets, packets)
		}
		if d.Packets != packets {
			return fmt.Errorf("%d", d.Packets)
		}
		return nil
	})
	return d
}

// TestDropCounts: every packet a per-pod chain drops is counted, the
// count survives an Update that refills the chain and an Apply that
// rewrites the table, and the chain samples its drops to NFLOG group
// table.LogGroup with the direction and network in the prefix.
func TestDropCounts(t *testing.T) {
	l := newLab(t)
	l.incremental = true
	deny := policy("ns", "deny-b", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "b"), PolicyTypes: ingressOnly})
	l.apply(t, l.input(deny))
	out := nft(t, l.Node, "list", "chain", "inet", table.PolicyTable("t"), "in.ns/b")
	if !strings.Contains(out, `limit rate 20/second burst 20 packets log prefix "village:in:t" group 22087`) {
		t.Errorf("b's ingress chain samples no drop to NFLOG:\n%s", out)
	}

	const n = 25
	sendUDP(t, l.Pods["a"], l.V4["b"], 9, n)
	sendUDP(t, l.Pods["a"], l.V6["b"], 9, n)
	d := waitDrops(t, l.Node, "t", "in.ns/b", 2*n)
	if d.Key != "ns/b" || d.Direction != "ingress" || d.Bytes == 0 {
		t.Errorf("drops of in.ns/b: %+v", d)
	}

	// an allow from c refills b's chain (Update): the count stays
	allow := policy("ns", "allow-c", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "b"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "c")}}}}})
	l.apply(t, l.input(deny, allow))
	if got := dropsOf(t, l.Node, "t", "in.ns/b"); got.Counts != d.Counts {
		t.Errorf("after the Update that refilled the chain: %+v, want %+v", got.Counts, d.Counts)
	}
	l.reach(t, "c", "b", 80, true)
	if got := dropsOf(t, l.Node, "t", "in.ns/b"); got.Counts != d.Counts {
		t.Errorf("allowed traffic was counted as dropped: %+v, want %+v", got.Counts, d.Counts)
	}

	// Apply rewrites the table: the count stays
	l.incremental = false
	l.apply(t, l.input(deny, allow))
	if got := dropsOf(t, l.Node, "t", "in.ns/b"); got.Counts != d.Counts {
		t.Errorf("after Apply: %+v, want %+v", got.Counts, d.Counts)
	}
	sendUDP(t, l.Pods["a"], l.V4["b"], 9, n)
	waitDrops(t, l.Node, "t", "in.ns/b", 3*n)
	out = nft(t, l.Node, "list", "chain", "inet", table.PolicyTable("t"), "in.ns/b")
	if strings.Count(out, "log prefix") != 1 || strings.Count(out, `counter name "in.ns/b" drop`) != 1 {
		t.Errorf("b's ingress chain after the rewrites:\n%s", out)
	}

	// the counter goes with its chain
	l.incremental = true
	l.apply(t, l.input())
	var all []table.ChainDrops
	if err := testenv.InNS(l.Node, func() (err error) { all, err = table.Drops("t"); return err }); err != nil || len(all) != 0 {
		t.Errorf("drop counters with no isolated pod: %+v %v", all, err)
	}
	if out := nft(t, l.Node, "list", "table", "inet", table.PolicyTable("t")); strings.Contains(out, "counter in.") {
		t.Errorf("a counter left after its chain went:\n%s", out)
	}
}

func TestPrefix(t *testing.T) {
	for _, tc := range []struct{ dir, network, prefix string }{
		{"ingress", "t", "village:in:t"},
		{"egress", "village-net", "village:eg:village-net"},
		{"ingress", strings.Repeat("n", 200), "village:in:" + strings.Repeat("n", 116)},
	} {
		p := table.LogPrefix(tc.dir, tc.network)
		if p != tc.prefix {
			t.Errorf("LogPrefix(%s, %s) = %q, want %q", tc.dir, tc.network, p, tc.prefix)
		}
		dir, network, ok := table.ParsePrefix(p)
		if !ok || dir != tc.dir || !strings.HasPrefix(tc.network, network) {
			t.Errorf("ParsePrefix(%q) = %s %s %v", p, dir, network, ok)
		}
	}
	for _, p := range []string{"", "village:", "village:xx:t", "other:in:t", "village:in"} {
		if _, _, ok := table.ParsePrefix(p); ok {
			t.Errorf("ParsePrefix(%q) ok", p)
		}
	}
}

// BenchmarkDrops: reading the drop counters of the bench world (1,000
// isolated pods, one chain each): what a scrape of
// village_policy_drops_total and `villaged drops` cost.
func BenchmarkDrops(b *testing.B) {
	rs := Compile(benchWorld())
	node := testenv.NewNS(b)
	if err := testenv.InNS(node, func() error { return table.Apply(rs) }); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var all []table.ChainDrops
		if err := testenv.InNS(node, func() (err error) { all, err = table.Drops("bench"); return err }); err != nil {
			b.Fatal(err)
		}
		if len(all) != len(rs.Pods) {
			b.Fatalf("%d counters for %d isolated pods", len(all), len(rs.Pods))
		}
	}
}
