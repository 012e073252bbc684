package netpol

import (
	"fmt"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/table"
)

// benchWorld is 1,000 pods on this node in 10 namespaces (app=app<i%50>)
// and 100 policies: each isolates one app of its namespace and allows it
// from two other apps of every namespace on a port and from an ipBlock.
func benchWorld() Input {
	in := Input{Network: "bench", Namespaces: map[string]map[string]string{}, Local: map[string]bool{}}
	for n := range 10 {
		in.Namespaces[fmt.Sprintf("ns%d", n)] = map[string]string{"team": fmt.Sprint(n % 3)}
	}
	for i := range 1000 {
		ip := netip.AddrFrom4([4]byte{10, 200, byte(i / 250), byte(i%250 + 2)})
		p := pod(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i), map[string]string{"app": fmt.Sprintf("app%d", i%50)}, ip.String())
		in.Pods = append(in.Pods, p)
		in.Local[p.Key()] = true
	}
	for j := range 100 {
		in.Policies = append(in.Policies, policy(fmt.Sprintf("ns%d", j%10), fmt.Sprintf("pol%d", j), networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", fmt.Sprintf("app%d", j%50)),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: sel(), PodSelector: sel("app", fmt.Sprintf("app%d", (j+1)%50))},
					{NamespaceSelector: sel(), PodSelector: sel("app", fmt.Sprintf("app%d", (j+2)%50))},
					{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.1.0/24"}}}},
				Ports: []networkingv1.NetworkPolicyPort{tcp(80 + j%5)}}}}))
	}
	return in
}

// BenchmarkCompile: 100 policies, 1,000 local pods, pure compile.
func BenchmarkCompile(b *testing.B) {
	in := benchWorld()
	for b.Loop() {
		Compile(in)
	}
}

// BenchmarkApply: one compiled change of that world into the kernel (the
// table replaced in one transaction), in a test namespace.
func BenchmarkApply(b *testing.B) {
	rs := Compile(benchWorld())
	node := testenv.NewNS(b)
	b.ReportMetric(float64(len(rs.Pods)), "isolated-pods")
	b.ReportMetric(float64(len(rs.Sets)), "sets")
	for b.Loop() {
		if err := testenv.InNS(node, func() error { return table.Apply(rs) }); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLargeTable: the bench world (1,000 isolated pods, 100 policies) and
// a rule whose peer set holds 5,000 pods go into the kernel in one
// transaction each, and the kernel holds what was compiled.
func TestLargeTable(t *testing.T) {
	node := testenv.NewNS(t)
	in := benchWorld()
	for i := range 5000 {
		ip := netip.AddrFrom4([4]byte{10, 201, byte(i / 125), byte(i%125*2 + 2)}) // not adjacent: no ranges merge
		in.Pods = append(in.Pods, pod("far", fmt.Sprintf("f%d", i), map[string]string{"app": "far"}, ip.String()))
	}
	in.Namespaces["far"] = map[string]string{}
	in.Policies = append(in.Policies, policy("ns0", "from-far", networkingv1.NetworkPolicySpec{PodSelector: *sel(),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel(), PodSelector: sel("app", "far")}}}}}))
	rs := Compile(in)
	largest := 0
	for _, s := range rs.Sets {
		largest = max(largest, len(s.Ranges))
	}
	if len(rs.Pods) != 1000 || largest != 5000 {
		t.Fatalf("compiled %d isolated pods, largest set %d", len(rs.Pods), largest)
	}
	var have table.Summary
	if err := testenv.InNS(node, func() (err error) {
		if err = table.Apply(rs); err == nil {
			have, _, err = table.Observe("bench")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if d := table.Diff(table.Summarize(rs), have); d != "" {
		t.Errorf("the kernel differs from the compile: %s", d)
	}
}
