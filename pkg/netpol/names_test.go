package netpol

import (
	"net"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netpol/table"
)

// TestNetworksXAndPolicyX: networks "x", "policy-x" and "pending-x" on one
// node, each with nftables masquerade and NetworkPolicy, keep their own
// tables. x's policy and pending tables used to be named
// village-policy-x and village-pending-x, the masquerade tables of
// policy-x and pending-x: each Apply of x replaced policy-x's masquerade
// table, each masquerade repair of policy-x deleted x's policies. Proven
// on the kernel: seven distinct tables, every network's masquerade intact
// after x's Apply, and x's deny still dropping after policy-x's and
// pending-x's masquerade is written again.
func TestNetworksXAndPolicyX(t *testing.T) {
	l := newLab(t)
	_, cluster, _ := net.ParseCIDR("10.9.0.0/16")
	spec := func(n string) masq.Spec {
		return masq.Spec{Network: n, PodSubnets: []*net.IPNet{cluster}, Cluster: []*net.IPNet{cluster}, Backend: masq.NFTables, ForwardAccept: true}
	}
	networks := []string{"x", "policy-x", "pending-x"}
	for _, n := range networks {
		t.Cleanup(func() {
			_ = testenv.InNS(l.Node, func() error { return masq.Teardown(n) })
			_ = testenv.InNS(l.Node, func() error { return table.Remove(n) })
		})
		if err := testenv.InNS(l.Node, func() error { return masq.Ensure(spec(n)) }); err != nil {
			t.Fatal(err)
		}
	}
	deny := policy("ns", "deny-b", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "b"), PolicyTypes: ingressOnly})
	for _, n := range []string{"x", "policy-x"} {
		in := l.input()
		if n == "x" {
			in = l.input(deny)
		}
		in.Network = n
		l.apply(t, in)
	}
	l.reach(t, "a", "b", 80, false)
	l.reach(t, "a", "c", 80, true)

	var tables []string
	for _, line := range strings.Split(nft(t, l.Node, "list", "tables", "inet"), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "table inet "); ok {
			tables = append(tables, name)
		}
	}
	slices.Sort(tables)
	want := []string{"village-pending-x", "village-policy-x", "village-x",
		"village_pending-policy-x", "village_pending-x", "village_policy-policy-x", "village_policy-x"}
	if !slices.Equal(tables, want) {
		t.Errorf("inet tables %v, want %v", tables, want)
	}
	for _, n := range networks {
		if err := testenv.InNS(l.Node, func() error { return masq.Check(spec(n), masq.Node{}) }); err != nil {
			t.Errorf("masquerade of %s after the policies of x and policy-x: %v", n, err)
		}
	}

	// policy-x's and pending-x's masquerade written again (a repair):
	// x's policies and pending marks stay.
	for _, n := range []string{"policy-x", "pending-x"} {
		if err := testenv.InNS(l.Node, func() error { return masq.Ensure(spec(n)) }); err != nil {
			t.Fatal(err)
		}
	}
	l.reach(t, "a", "b", 80, false)
	var have table.Summary
	var present bool
	if err := testenv.InNS(l.Node, func() (err error) { have, present, err = table.Observe("x"); return err }); err != nil || !present {
		t.Fatalf("x's policy table after policy-x's masquerade: present %v, %v", present, err)
	}
	in := l.input(deny)
	in.Network = "x"
	if d := table.Diff(table.Summarize(Compile(in)), have); d != "" {
		t.Errorf("x's policy table changed under policy-x's masquerade: %s", d)
	}
}

// TestLegacyTablesRemoved: a node upgraded from the old names holds x's
// policy tables as village-policy-x and village-pending-x; the first Apply
// removes them in the transaction that installs the new ones (their
// stale drops would stay in force), and Remove does too.
func TestLegacyTablesRemoved(t *testing.T) {
	l := newLab(t)
	t.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return table.Remove("x") }) })
	old := func() {
		nft(t, l.Node, "add", "table", "inet", "village-policy-x")
		nft(t, l.Node, "add", "set", "inet", "village-policy-x", "ingress4", "{ type ipv4_addr; flags interval; }")
		// an old rule that drops every forwarded TCP packet (neighbour
		// discovery passes, as in the real table)
		nft(t, l.Node, "add", "chain", "inet", "village-policy-x", "forward", "{ type filter hook forward priority 0; }")
		nft(t, l.Node, "add", "rule", "inet", "village-policy-x", "forward", "meta", "l4proto", "tcp", "drop")
		nft(t, l.Node, "add", "table", "inet", "village-pending-x")
		nft(t, l.Node, "add", "set", "inet", "village-pending-x", "pending4", "{ type ipv4_addr; }")
	}
	old()
	l.reach(t, "a", "c", 80, false)
	in := l.input()
	in.Network = "x"
	l.apply(t, in)
	l.reach(t, "a", "c", 80, true)
	if out := nft(t, l.Node, "list", "tables", "inet"); strings.Contains(out, "village-") {
		t.Errorf("old tables left after Apply:\n%s", out)
	}
	old()
	if err := testenv.InNS(l.Node, func() error { return table.Remove("x") }); err != nil {
		t.Fatal(err)
	}
	if out := nft(t, l.Node, "list", "tables", "inet"); strings.Contains(out, "village") {
		t.Errorf("tables left after Remove:\n%s", out)
	}
}
