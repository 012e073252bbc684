package netpol

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// BenchmarkUnchanged: the controller's test of whether a compile changed
// anything (it compiles on every watched change and goes to the kernel
// only when the table differs), on two compiles of the same world: the
// rendered text it compared until table.Equal, and table.Equal.
func BenchmarkUnchanged(b *testing.B) {
	in := benchWorld()
	x, y := Compile(in), Compile(in)
	b.Run("text", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if x.String()+fmt.Sprint(x.Sets, x.Compiled) != y.String()+fmt.Sprint(y.Sets, y.Compiled) {
				b.Fatal("two compiles of one world differ")
			}
		}
	})
	b.Run("Equal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !table.Equal(x, y) {
				b.Fatal("two compiles of one world differ")
			}
		}
	})
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

// BenchmarkChange: one change of the bench world, from the compile to the
// rules in the kernel, written as the whole table (apply, what every
// change cost before table.Update) or as its difference (update). The
// world alternates between before and after the change, so every
// iteration is one change. "policy" changes the port of pol0, whose rule
// applies to 20 pods; "pod" adds (then removes) a pod that one policy
// isolates and three policies' peer sets hold; "nothing" is the fixed cost
// of a transaction (the pending table ensured, its marks listed). The controller adds its
// 100 ms settle to this. kernel-ms/op is the nftables transaction alone
// (ns/op less the compile).
func BenchmarkChange(b *testing.B) {
	changes := map[string]func(*Input){
		"nothing": func(*Input) {},
		"policy": func(in *Input) {
			pol := in.Policies[0].DeepCopy()
			pol.Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{tcp(81)}
			in.Policies = append([]*networkingv1.NetworkPolicy{pol}, in.Policies[1:]...)
		},
		"pod": func(in *Input) {
			p := pod("ns3", "new", map[string]string{"app": "app3"}, "10.200.9.2")
			in.Pods = append(slices.Clone(in.Pods), p)
			in.Local = maps.Clone(in.Local)
			in.Local[p.Key()] = true
		},
	}
	for _, what := range []string{"nothing", "policy", "pod"} {
		for _, how := range []string{"apply", "update"} {
			b.Run(what+"/"+how, func(b *testing.B) {
				before := benchWorld()
				after := benchWorld()
				changes[what](&after)
				node := testenv.NewNS(b)
				last := Compile(before)
				if err := testenv.InNS(node, func() error { return table.Apply(last) }); err != nil {
					b.Fatal(err)
				}
				worlds := [2]Input{after, before}
				i := 0
				var kernel time.Duration
				for b.Loop() {
					rs := Compile(worlds[i%2])
					i++
					start := time.Now()
					if err := testenv.InNS(node, func() error {
						if how == "apply" {
							return table.Apply(rs)
						}
						return table.Update(last, rs)
					}); err != nil {
						b.Fatal(err)
					}
					kernel += time.Since(start)
					last = rs
				}
				b.ReportMetric(float64(kernel.Microseconds())/1000/float64(b.N), "kernel-ms/op")
				b.ReportMetric(float64(table.Changes(Compile(before), Compile(after))), "changes")
			})
		}
	}
}

// BenchmarkThroughput: TCP throughput (iperf3, one stream, 5 s) from pod a
// to pod b of one node's bridge with no policy tables at all and with the
// bench world's 100 policies and 1,000 pods compiled, a and b among them:
// b isolated by two of the world's policies plus one that allows a on
// iperf3's port, a's egress isolated and allowed to b. Reported in Gbit/s.
func BenchmarkThroughput(b *testing.B) {
	for _, with := range []string{"none", "100-policies"} {
		b.Run(with, func(b *testing.B) {
			l := testenv.NewPodLab(b)
			l.AddPod("a", 2, true)
			l.AddPod("b", 3, true)
			if with != "none" {
				in := benchWorld()
				a := pod("ns0", "a", map[string]string{"app": "client"}, l.V4["a"])
				srv := pod("ns0", "b", map[string]string{"app": "app0"}, l.V4["b"])
				in.Pods = append(in.Pods, a, srv)
				in.Local[a.Key()], in.Local[srv.Key()] = true, true
				iperf := networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolTCP), Port: ptr(intOrString(5201))}
				in.Policies = append(in.Policies,
					policy("ns0", "iperf-in", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "app0"),
						Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}, Ports: []networkingv1.NetworkPolicyPort{iperf}}}}),
					policy("ns0", "iperf-out", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
						Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "app0")}}, Ports: []networkingv1.NetworkPolicyPort{iperf}}}}))
				rs := Compile(in)
				if err := testenv.InNS(l.Node, func() error { return table.Apply(rs) }); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return table.Remove(rs.Network) }) })
			}
			testenv.ServeIperf3(b, l.Pods["b"], l.V4["b"])
			var gbits float64
			for b.Loop() {
				gbits += testenv.Iperf3(b, l.Pods["a"], l.V4["b"], 5*time.Second)
			}
			b.ReportMetric(gbits/float64(b.N), "Gbit/s")
		})
	}
}
