package netpol

import (
	"errors"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/netpol/table"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
)

// lab is three pods on one node's bridge. With incremental set, apply
// installs each compile with table.Update from the one before (the first
// with Apply), else with table.Apply.
type lab struct {
	*testenv.PodLab
	incremental bool
	last        *table.Ruleset
}

func newLab(t *testing.T) *lab {
	l := &lab{PodLab: testenv.NewPodLab(t)}
	for i, name := range []string{"a", "b", "c"} {
		l.AddPod(name, i+2, true)
	}
	return l
}

func (l *lab) reach(t *testing.T, from, to string, port int, want bool) {
	l.Reach(t, from, to, port, want)
}

// input is the lab as Compile sees it: every pod local, labelled
// app=<name>, all in namespace ns (labelled name=ns), port 8080 named
// "alt".
func (l *lab) input(pols ...*networkingv1.NetworkPolicy) Input {
	in := Input{Network: "t", Policies: pols, Local: map[string]bool{}, Namespaces: map[string]map[string]string{"ns": {"name": "ns"}}}
	for name := range l.Pods {
		p := pod("ns", name, map[string]string{"app": name}, l.V4[name], l.V6[name])
		p.Ports = []NamedPort{{Name: "alt", Protocol: table.ProtoTCP, Port: 8080}}
		in.Pods = append(in.Pods, p)
		in.Local[p.Key()] = true
	}
	return in
}

func (l *lab) apply(t *testing.T, in Input) *table.Ruleset {
	t.Helper()
	rs := Compile(in)
	if len(rs.Problems) > 0 {
		t.Fatalf("problems: %v", rs.Problems)
	}
	var have table.Summary
	if err := testenv.InNS(l.Node, func() (err error) {
		if l.incremental {
			err = table.Update(l.last, rs)
		} else {
			err = table.Apply(rs)
		}
		if err == nil {
			have, _, err = table.Observe(rs.Network)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	l.last = rs
	if d := table.Diff(table.Summarize(rs), have); d != "" {
		t.Errorf("the kernel differs from the compile: %s", d)
	}
	return rs
}

func nft(t *testing.T, n ns.NetNS, args ...string) string { return testenv.Nft(t, n, args...) }

// TestEnforce proves the compiled tables on traffic bridged between pods
// of one node, IPv4 and IPv6: the inet forward hook sees it because the
// bridge calls netfilter. "update" installs every change after the first
// with table.Update (only what differs), "apply" rewrites the table.
func TestEnforce(t *testing.T) {
	for _, mode := range []string{"apply", "update"} {
		t.Run(mode, func(t *testing.T) {
			l := newLab(t)
			l.incremental = mode == "update"
			enforce(t, l)
		})
	}
}

func enforce(t *testing.T, l *lab) {
	l.reach(t, "a", "b", 80, true)

	// default deny ingress for b: nothing reaches it, b still reaches
	// out (egress not isolated, the answers are established), the node
	// reaches it (kubelet's probes).
	deny := policy("ns", "deny-b", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "b"), PolicyTypes: ingressOnly})
	l.apply(t, l.input(deny))
	l.reach(t, "a", "b", 80, false)
	l.reach(t, "c", "b", 8080, false)
	l.reach(t, "b", "a", 80, true)
	l.reach(t, "node", "b", 80, true)
	if d := dropsOf(t, l.Node, "t", "in.ns/b"); d.Packets == 0 {
		t.Errorf("the drop rule of b's ingress chain counted nothing: %+v", d)
	}

	// allow a to b's named port "alt" (8080) only
	allow := policy("ns", "allow-a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "b"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}},
			Ports: []networkingv1.NetworkPolicyPort{named("TCP", "alt")}}}})
	l.apply(t, l.input(deny, allow))
	l.reach(t, "a", "b", 8080, true)
	l.reach(t, "a", "b", 80, false)
	l.reach(t, "c", "b", 8080, false)

	// egress of a: only to the ipBlock 10.9.0.0/24 (and fd09::/64) except
	// c, ports 8000-9000
	eg := policy("ns", "eg-a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "a"), PolicyTypes: egressOnly,
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.9.0.0/24", Except: []string{l.V4["c"] + "/32"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "fd09::/64", Except: []string{l.V6["c"] + "/128"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr[corev1Protocol]("TCP"), Port: ptr(intOrString(8000)), EndPort: ptr(int32(9000))}}}}})
	l.apply(t, l.input(deny, allow, eg))
	l.reach(t, "a", "b", 8080, true)
	l.reach(t, "a", "c", 8080, false)
	l.reach(t, "a", "c", 80, false)
	l.reach(t, "c", "a", 80, true) // a's ingress is open; its answers are established

	// a deleted policy's rules go
	l.apply(t, l.input())
	l.reach(t, "a", "c", 80, true)
	l.reach(t, "a", "b", 80, true)
	if out := nft(t, l.Node, "list", "table", "inet", table.PolicyTable("t")); strings.Contains(out, "in.ns/") || strings.Contains(out, "eg.ns/") {
		t.Errorf("per-pod chains left after the policies went:\n%s", out)
	}

	// Remove: nothing of either table is left.
	if err := testenv.InNS(l.Node, func() error { return table.Remove("t") }); err != nil {
		t.Fatal(err)
	}
	if out := nft(t, l.Node, "list", "tables"); strings.Contains(out, "village") {
		t.Errorf("tables left: %s", out)
	}
}

// TestPending: a marked address is unreachable (and cannot send) until an
// Apply compiles it, even with no policy at all.
func TestPending(t *testing.T) {
	l := newLab(t)
	b := []netip.Addr{netip.MustParseAddr(l.V4["b"]), netip.MustParseAddr(l.V6["b"])}
	mark := func() error { return testenv.InNS(l.Node, func() error { return table.MarkPending("t", b) }) }
	if err := mark(); !errors.Is(err, table.ErrNoController) {
		t.Fatalf("marking with no controller: %v", err)
	}
	in := l.markB(t, mark)
	l.reach(t, "b", "c", 80, false)
	// the network's masquerade with forwardAccept (nftables) leaves the
	// pending chain alone: its accept at the top would let b through
	_, cluster, _ := net.ParseCIDR("10.9.0.0/16")
	if err := testenv.InNS(l.Node, func() error {
		return masq.Ensure(masq.Spec{Network: "t", PodSubnets: []*net.IPNet{cluster}, Cluster: []*net.IPNet{cluster}, Backend: masq.NFTables, ForwardAccept: true})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return masq.Teardown("t") }) })
	l.reach(t, "a", "b", 80, false)
	// an Apply that does not know b keeps the mark
	l.apply(t, in)
	l.reach(t, "a", "b", 80, false)
	var left []netip.Addr
	_ = testenv.InNS(l.Node, func() (err error) { left, err = table.Pending("t"); return err })
	if len(left) != 2 {
		t.Fatalf("pending after an apply that did not compile b: %v", left)
	}
	l.apply(t, l.input())
	l.reach(t, "a", "b", 80, true)
	l.reach(t, "b", "c", 80, true)
	_ = testenv.InNS(l.Node, func() (err error) { left, err = table.Pending("t"); return err })
	if len(left) != 0 {
		t.Fatalf("pending after compiling b: %v", left)
	}
}

// TestEnsurePending: the pending table deleted (its marks with it) is
// made again alone by EnsurePending, empty, and marks hold from then on;
// EnsurePending of a table that is there keeps its marks.
func TestEnsurePending(t *testing.T) {
	l := newLab(t)
	b := []netip.Addr{netip.MustParseAddr(l.V4["b"]), netip.MustParseAddr(l.V6["b"])}
	mark := func() error { return testenv.InNS(l.Node, func() error { return table.MarkPending("t", b) }) }
	ensure := func() {
		t.Helper()
		if err := testenv.InNS(l.Node, func() error { return table.EnsurePending("t", l.last.Bridge, nil) }); err != nil {
			t.Fatal(err)
		}
	}
	pending := func() []netip.Addr {
		t.Helper()
		var left []netip.Addr
		if err := testenv.InNS(l.Node, func() (err error) { left, err = table.Pending("t"); return err }); err != nil {
			t.Fatal(err)
		}
		return left
	}
	l.markB(t, mark)
	nft(t, l.Node, "delete", "table", "inet", table.PendingTable("t"))
	l.reach(t, "a", "b", 80, true) // the mark went with the table
	if err := mark(); !errors.Is(err, table.ErrNoController) {
		t.Fatalf("marking with the pending table gone: %v", err)
	}
	ensure()
	if left := pending(); len(left) != 0 {
		t.Fatalf("pending after EnsurePending of a deleted table: %v, want none", left)
	}
	if err := mark(); err != nil {
		t.Fatal(err)
	}
	l.reach(t, "a", "b", 80, false)
	l.reach(t, "b", "c", 80, false)
	ensure()
	if left := pending(); len(left) != 2 {
		t.Fatalf("pending after EnsurePending of a table that was there: %v, want b's two addresses", left)
	}
	l.reach(t, "a", "b", 80, false)
	l.apply(t, l.input())
	l.reach(t, "a", "b", 80, true)
}

// markB applies the lab's input without pod b (not seen yet), marks b
// pending with mark, and checks that a cannot reach it; it returns that
// input.
func (l *lab) markB(t *testing.T, mark func() error) Input {
	t.Helper()
	in := l.input()
	in.Local = map[string]bool{"ns/a": true, "ns/c": true} // b not seen yet
	l.apply(t, in)
	if err := mark(); err != nil {
		t.Fatal(err)
	}
	l.reach(t, "a", "b", 80, false)
	return in
}

type corev1Protocol = corev1.Protocol

func intOrString(v int32) intstr.IntOrString { return intstr.FromInt32(v) }

// counterValues matches an nft counter with its values, as `nft list`
// prints it.
var counterValues = regexp.MustCompile(`counter packets [0-9]+ bytes [0-9]+`)

// TestLinkLocalRules: both forward chains (policy and pending) drop the
// bridge's IPv6 link-local traffic, source and destination, after the
// neighbour-discovery accept; the policy chain before its
// established accept. Golden text as nft prints the kernel's rules, with
// the counters' values taken out: the kernel's own MLD reports on the
// bridge move them, and the test is about the rules, not the traffic.
func TestLinkLocalRules(t *testing.T) {
	l := newLab(t)
	in := l.input()
	in.Bridge = "br0"
	l.apply(t, in)
	want := []string{
		// ip6 saddr fe80::/10, ip6 daddr fe80::/10 (nft prints the raw
		// payload of a two-byte load)
		`iifname "br0" meta nfproto ipv6 @nh,64,16 & 0xffc0 == 0xfe80 counter drop`,
		`iifname "br0" meta nfproto ipv6 @nh,192,16 & 0xffc0 == 0xfe80 counter drop`,
	}
	for _, tbl := range []string{table.PolicyTable("t"), table.PendingTable("t")} {
		out := nft(t, l.Node, "list", "chain", "inet", tbl, "forward")
		var lines []string
		for _, ln := range strings.Split(out, "\n") {
			lines = append(lines, counterValues.ReplaceAllString(strings.TrimSpace(ln), "counter"))
		}
		at := map[string]int{}
		for i, ln := range lines {
			at[ln] = i
		}
		nd := -1
		for i, ln := range lines {
			if ln == "icmpv6 type 133-137 accept" {
				nd = i
			}
		}
		for _, w := range want {
			i, ok := at[w]
			if !ok || i < nd || nd < 0 {
				t.Errorf("table %s: want %q after the neighbour-discovery accept:\n%s", tbl, w, out)
			}
			if ct, ok := at["ct state established,related accept"]; ok && ct < i {
				t.Errorf("table %s: the established accept comes before %q:\n%s", tbl, w, out)
			}
		}
	}
}

// TestMarkNewPodTableGone: the namespaces file lists the pod's namespace
// (a controller compiled here) but the pending table is gone (`nft flush
// ruleset` under the running controller, before its repair). With the
// network enforcing NetworkPolicy, ADD's MarkNewPod makes the table and
// marks the pod, which is then unreachable; without, a missing table
// means no controller and nothing is marked.
func TestMarkNewPodTableGone(t *testing.T) {
	l := newLab(t)
	run := t.TempDir()
	if err := table.WriteNamespaces(table.NamespacesPath(run, "t"), []string{"ns"}); err != nil {
		t.Fatal(err)
	}
	b := []netip.Addr{netip.MustParseAddr(l.V4["b"]), netip.MustParseAddr(l.V6["b"])}
	mark := func(enforcing bool) (marked bool, err error) {
		err = testenv.InNS(l.Node, func() (err error) {
			marked, err = table.MarkNewPod(run, "t", "br0", "ns", b, enforcing)
			return err
		})
		return marked, err
	}
	if marked, err := mark(false); err != nil || marked {
		t.Fatalf("without enforcing and no table: marked %v, %v; want nothing marked", marked, err)
	}
	l.reach(t, "a", "b", 80, true) // the positive control: no table, no rule
	marked, err := mark(true)
	if err != nil || !marked {
		t.Fatalf("enforcing with the table gone: marked %v, %v; want marked", marked, err)
	}
	t.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return table.Remove("t") }) })
	l.reach(t, "a", "b", 80, false)
	l.reach(t, "a", "c", 80, true)
}
