package netpol

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/netpol/table"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func podEnd(key string) Endpoint { return Endpoint{Pod: key} }
func ipEnd(ip string) Endpoint   { return Endpoint{IP: netip.MustParseAddr(ip)} }
func ingressRule(from []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: from, Ports: ports}}
}

// TestExplain asks the world of compile_test.go about connections under
// one set of policies per case; want are texts the verdict's summary and
// reasons must hold.
func TestExplain(t *testing.T) {
	denyAll := policy("a", "deny-all", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly})
	cases := []struct {
		name     string
		pols     []*networkingv1.NetworkPolicy
		from, to Endpoint
		port     uint16
		proto    table.Proto
		allowed  bool
		// want are texts of the verdict; "!text": a text it must not say
		want []string
	}{
		{"no policy: nothing isolated", nil, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, true,
			[]string{"allowed: b/client (10.0.1.5) -> a/web (10.0.1.2) port 80/TCP", "pod a/web is not isolated for ingress", "pod b/client is not isolated for egress"}},
		{"deny-all", []*networkingv1.NetworkPolicy{denyAll}, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, false,
			[]string{"denied: b/client (10.0.1.5) -> a/web (10.0.1.2) port 80/TCP", "denied: pod a/web is isolated for ingress by a/deny-all and no rule admits 10.0.1.5 to 80/TCP"}},
		{"port rule admits its port", []*networkingv1.NetworkPolicy{denyAll, policy("a", "allow-web", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, tcp(80))})}, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, true,
			[]string{"allowed by a/allow-web spec.ingress[0] port 80/TCP", "isolated"}},
		{"port rule: another port", []*networkingv1.NetworkPolicy{policy("a", "allow-web", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, tcp(80))})}, podEnd("b/client"), podEnd("a/web"), 81, table.ProtoTCP, false,
			[]string{"by a/allow-web and no rule admits 10.0.1.5 to 81/TCP"}},
		{"port rule: another protocol", []*networkingv1.NetworkPolicy{policy("a", "allow-web", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, tcp(80))})}, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoUDP, false,
			[]string{"to 80/UDP"}},
		{"port without protocol is TCP", []*networkingv1.NetworkPolicy{policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, networkingv1.NetworkPolicyPort{Port: ptr(intstr.FromInt32(80))})})}, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, true,
			[]string{"a/p spec.ingress[0] port 80/TCP"}},
		{"endPort range", []*networkingv1.NetworkPolicy{policy("a", "range", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolTCP), Port: ptr(intstr.FromInt32(8000)), EndPort: ptr(int32(8100))})})},
			podEnd("b/client"), podEnd("a/web"), 8100, table.ProtoTCP, true, []string{"a/range spec.ingress[0] ports 8000-8100/TCP"}},
		{"endPort range: past its end", []*networkingv1.NetworkPolicy{policy("a", "range", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolTCP), Port: ptr(intstr.FromInt32(8000)), EndPort: ptr(int32(8100))})})},
			podEnd("b/client"), podEnd("a/web"), 8101, table.ProtoTCP, false, []string{"no rule admits 10.0.1.5 to 8101/TCP"}},
		{"namespaceSelector admits the namespace's pods", []*networkingv1.NetworkPolicy{policy("a", "ns", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "none")}, {NamespaceSelector: sel("team", "y")}})})},
			podEnd("b/client"), podEnd("a/web"), 443, table.ProtoTCP, true, []string{"allowed by a/ns spec.ingress[0].from[1] all ports"}},
		{"namespaceSelector: another namespace", []*networkingv1.NetworkPolicy{policy("a", "ns", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y")}})})},
			ipEnd("10.0.2.3"), podEnd("a/web"), 443, table.ProtoTCP, false, []string{"denied: a/db (10.0.2.3) -> a/web (10.0.1.2)", "no rule admits 10.0.2.3"}},
		{"podSelector AND namespaceSelector", []*networkingv1.NetworkPolicy{policy("a", "and", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "api")}})})},
			podEnd("b/api"), podEnd("a/web"), 80, table.ProtoTCP, true, []string{"a/and spec.ingress[0].from[0]"}},
		{"podSelector AND namespaceSelector: the namespace's other pod", []*networkingv1.NetworkPolicy{policy("a", "and", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "api")}})})},
			podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, false, []string{"isolated for ingress by a/and"}},
		{"ipBlock", []*networkingv1.NetworkPolicy{policy("a", "block", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}}}})})},
			ipEnd("10.0.2.3"), podEnd("a/web"), 80, table.ProtoTCP, true, []string{"a/block spec.ingress[0].from[0] all ports"}},
		{"ipBlock: in its except", []*networkingv1.NetworkPolicy{policy("a", "block", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}}}})})},
			podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, false, []string{"no rule admits 10.0.1.5"}},
		{"ipBlock IPv6", []*networkingv1.NetworkPolicy{policy("a", "block", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/64", Except: []string{"fd00::1:0/112"}}}})})},
			ipEnd("fd00::1:5"), podEnd("a/web"), 80, table.ProtoTCP, false, []string{"b/client (fd00::1:5) -> a/web (fd00::1:2)", "no rule admits fd00::1:5"}},
		{"ipBlock IPv6: outside the except", []*networkingv1.NetworkPolicy{policy("a", "block", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/64", Except: []string{"fd00::1:0/112"}}}})})},
			ipEnd("fd00::2:5"), podEnd("a/web"), 80, table.ProtoTCP, true, []string{"fd00::2:5 -> a/web (fd00::1:2)", "fd00::2:5 is not a pod's address"}},
		{"egress deny", []*networkingv1.NetworkPolicy{policy("b", "no-out", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly})},
			podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, false, []string{"denied: pod b/client is isolated for egress by b/no-out and no rule admits 10.0.1.2 to 80/TCP"}},
		{"egress to an address outside the cluster", []*networkingv1.NetworkPolicy{policy("b", "dns", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "8.8.8.8/32"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intstr.FromInt32(53))}}}}})},
			podEnd("b/client"), ipEnd("8.8.8.8"), 53, table.ProtoUDP, true, []string{"allowed by b/dns spec.egress[0].to[0] port 53/UDP"}},
		{"named port on ingress", []*networkingv1.NetworkPolicy{policy("a", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, named(corev1.ProtocolTCP, "http"))})}, podEnd("b/client"), podEnd("a/web"), 8080, table.ProtoTCP, true,
			[]string{`a/named spec.ingress[0] port 8080/TCP (named port "http" of pod a/web)`}},
		{"named port on ingress: another number on the destination", []*networkingv1.NetworkPolicy{policy("a", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, named(corev1.ProtocolTCP, "http"))})}, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, false,
			[]string{`no rule admits 10.0.1.5 to 80/TCP; a/named spec.ingress[0] names port "http", which is 8080/TCP on pod a/web, not 80`}},
		{"named port on ingress: the destination has no such port", []*networkingv1.NetworkPolicy{policy("a", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, named(corev1.ProtocolTCP, "metrics"))})}, podEnd("b/client"), podEnd("a/web"), 9100, table.ProtoTCP, false,
			[]string{`a/named spec.ingress[0] names port "metrics", which pod a/web does not have (no TCP container port of that name): the rule admits nothing there`}},
		{"named port on ingress: the name is the destination's under another protocol", []*networkingv1.NetworkPolicy{policy("a", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, named(corev1.ProtocolTCP, "dns"))})}, podEnd("b/client"), podEnd("a/web"), 53, table.ProtoTCP, false,
			[]string{`names port "dns", which pod a/web does not have (no TCP container port of that name)`}},
		{"named port on ingress: a peer the rule does not name gets no note", []*networkingv1.NetworkPolicy{policy("a", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule([]networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "api")}}, named(corev1.ProtocolTCP, "http"))})}, podEnd("b/client"), podEnd("a/web"), 80, table.ProtoTCP, false,
			[]string{"no rule admits 10.0.1.5 to 80/TCP", "!names port"}},
		{"named port on egress resolves on the peer", []*networkingv1.NetworkPolicy{policy("b", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "http")}}}})},
			podEnd("b/client"), podEnd("b/api"), 9090, table.ProtoTCP, true, []string{`b/named spec.egress[0] port 9090/TCP (named port "http" of pod b/api)`}},
		{"named port on egress: another pod's number", []*networkingv1.NetworkPolicy{policy("b", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "http")}}}})},
			podEnd("b/client"), podEnd("b/api"), 8080, table.ProtoTCP, false, []string{`no rule admits 10.0.2.7 to 8080/TCP; b/named spec.egress[0] names port "http", which is 9090/TCP on pod b/api, not 8080`}},
		{"named port on egress to an address", []*networkingv1.NetworkPolicy{policy("b", "named", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "http")}}}})},
			podEnd("b/client"), ipEnd("8.8.8.8"), 80, table.ProtoTCP, false, []string{`b/named spec.egress[0] names port "http", but 8.8.8.8 is not a pod: only a pod's container ports have names`}},
		{"SCTP", []*networkingv1.NetworkPolicy{policy("a", "sctp", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolSCTP), Port: ptr(intstr.FromInt32(9000))})})},
			podEnd("b/client"), podEnd("a/web"), 9000, table.ProtoSCTP, true, []string{"port 9000/SCTP"}},
		{"unisolated pod beside an isolated one", []*networkingv1.NetworkPolicy{policy("a", "db-only", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db")})},
			podEnd("b/client"), podEnd("a/web"), 5432, table.ProtoTCP, true, []string{"pod a/web is not isolated for ingress: no NetworkPolicy selects it"}},
		{"a remote pod's ingress is its node's", []*networkingv1.NetworkPolicy{denyAll}, podEnd("b/client"), podEnd("a/db"), 5432, table.ProtoTCP, false,
			[]string{"denied: pod a/db is isolated for ingress by a/deny-all and no rule admits 10.0.1.5 to 5432/TCP (enforced on the pod's own node)"}},
		{"the node to its own pod", []*networkingv1.NetworkPolicy{denyAll}, Endpoint{IP: netip.MustParseAddr("192.168.50.1"), Node: true}, podEnd("a/web"), 80, table.ProtoTCP, true,
			[]string{"192.168.50.1 (this node) -> a/web", "traffic between this node and its own pods is always allowed"}},
		{"a local hostNetwork pod is the node", []*networkingv1.NetworkPolicy{denyAll}, podEnd("c/host"), podEnd("a/web"), 80, table.ProtoTCP, true,
			[]string{"always allowed"}},
		{"another node's address follows the policies", []*networkingv1.NetworkPolicy{denyAll}, ipEnd("192.168.50.2"), podEnd("a/web"), 80, table.ProtoTCP, false,
			[]string{"no rule admits 192.168.50.2"}},
		{"any port: the ports both sides allow", []*networkingv1.NetworkPolicy{policy("a", "allow-web", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, tcp(80), networkingv1.NetworkPolicyPort{Protocol: ptr(corev1.ProtocolUDP)})}),
			policy("b", "out", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intstr.FromInt32(50)), EndPort: ptr(int32(60))}, tcp(80)}}}})},
			podEnd("b/client"), podEnd("a/web"), 0, table.ProtoAny, true, []string{"allowed: b/client (10.0.1.5) -> a/web (10.0.1.2) any port (on port 80/TCP, ports 50-60/UDP)"}},
		{"any port: nothing in common", []*networkingv1.NetworkPolicy{policy("a", "allow-web", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
			Ingress: ingressRule(nil, tcp(80))}),
			policy("b", "out", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(443)}}}})},
			podEnd("b/client"), podEnd("a/web"), 0, table.ProtoAny, false, []string{"do not meet"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := roundTrip(t, BuildModel(world(tc.pols...)))
			v, err := Explain(m, tc.from, tc.to, tc.port, tc.proto)
			if err != nil {
				t.Fatal(err)
			}
			text := v.Summary + "\n" + v.Egress.Reason + "\n" + v.Ingress.Reason
			if v.Allowed != tc.allowed {
				t.Errorf("allowed %v, want %v:\n%s", v.Allowed, tc.allowed, text)
			}
			for _, w := range tc.want {
				if not, ok := strings.CutPrefix(w, "!"); ok {
					if strings.Contains(text, not) {
						t.Errorf("verdict says %q:\n%s", not, text)
					}
					continue
				}
				if !strings.Contains(text, w) {
					t.Errorf("verdict does not say %q:\n%s", w, text)
				}
			}
		})
	}
}

// TestExplainErrors: what Explain cannot answer it says, naming the end.
func TestExplainErrors(t *testing.T) {
	m := BuildModel(world())
	for _, tc := range []struct {
		from, to Endpoint
		want     string
	}{
		{podEnd("a/nope"), podEnd("a/web"), "pod a/nope: not known"},
		{podEnd("a/web"), podEnd("a/pending"), "pod a/pending: not known"}, // no address yet
		{podEnd("a/db"), ipEnd("fd00::9"), "no address of the same family"},
		{Endpoint{Pod: "a/web", IP: netip.MustParseAddr("10.9.9.9")}, podEnd("a/db"), "pod a/web has no address 10.9.9.9"},
		{Endpoint{}, podEnd("a/db"), "needs a pod or an address"},
	} {
		if _, err := Explain(m, tc.from, tc.to, 80, table.ProtoTCP); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v -> %+v: %v, want %q", tc.from, tc.to, err, tc.want)
		}
	}
}

// roundTrip is m after JSON and back, as villaged why reads it; it must
// be the same model.
func roundTrip(t testing.TB, m *Model) *Model {
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back Model
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, &back) {
		t.Fatalf("the model changed through JSON:\n%+v\n%+v", m, &back)
	}
	return &back
}

// TestExplainAgreesWithCompile: for random clusters and policies, Explain
// says for each side this node enforces what the compiled table does with
// the same packet (evaluated below as the nftables rules of table/nft.go
// evaluate it).
func TestExplainAgreesWithCompile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	probes := []uint16{53, 80, 443, 8080, 8081, 9000}
	protos := []table.Proto{table.ProtoTCP, table.ProtoUDP, table.ProtoSCTP}
	checked, denied := 0, 0
	for round := range 150 {
		in := randomWorld(r)
		rs := Compile(in)
		m := roundTrip(t, BuildModel(in))
		var addrs []netip.Addr
		for _, p := range in.Pods {
			if !p.HostNetwork {
				addrs = append(addrs, p.IPs...)
			}
		}
		addrs = append(addrs, netip.MustParseAddr("10.1.200.1"), netip.MustParseAddr("172.16.0.1"), netip.MustParseAddr("fd00::ffff"))
		for _, src := range addrs {
			for _, dst := range addrs {
				if src == dst || src.Is4() != dst.Is4() {
					continue
				}
				for _, port := range probes {
					for _, proto := range protos {
						v, err := Explain(m, Endpoint{IP: src}, Endpoint{IP: dst}, port, proto)
						if err != nil {
							t.Fatalf("round %d: %v", round, err)
						}
						eg, egLocal, ing, ingLocal := evaluate(rs, src, dst, port, proto)
						what := fmt.Sprintf("round %d: %s -> %s %d/%s", round, src, dst, port, proto)
						if egLocal && eg != v.Egress.Allowed {
							t.Fatalf("%s: the table's egress says %v, Explain %v (%s)\npolicies: %s", what, eg, v.Egress.Allowed, v.Egress.Reason, dumpPolicies(in))
						}
						if ingLocal && ing != v.Ingress.Allowed {
							t.Fatalf("%s: the table's ingress says %v, Explain %v (%s)\npolicies: %s", what, ing, v.Ingress.Allowed, v.Ingress.Reason, dumpPolicies(in))
						}
						if egLocal != (v.Egress.Here && v.Egress.Isolated) || ingLocal != (v.Ingress.Here && v.Ingress.Isolated) {
							t.Fatalf("%s: the table isolates egress %v ingress %v here, Explain %+v %+v", what, egLocal, ingLocal, v.Egress, v.Ingress)
						}
						checked++
						if !v.Allowed {
							denied++
						}
					}
				}
			}
		}
	}
	t.Logf("%d connections checked, %d denied", checked, denied)
	if denied == 0 || denied == checked {
		t.Fatalf("the generated policies decide everything one way (%d of %d denied): they test nothing", denied, checked)
	}
}

// evaluate runs a packet through rs as the policy table does: the
// source's egress chain, if it has one, then the destination's ingress
// chain; local says which chain exists.
func evaluate(rs *table.Ruleset, src, dst netip.Addr, port uint16, proto table.Proto) (egress, egLocal, ingress, inLocal bool) {
	egress, ingress = true, true
	for _, p := range rs.Pods {
		if slices.Contains(p.IPs, src) && p.Egress != nil {
			egress, egLocal = chainAllows(rs, p.Egress, dst, port, proto), true
		}
		if slices.Contains(p.IPs, dst) && p.Ingress != nil {
			ingress, inLocal = chainAllows(rs, p.Ingress, src, port, proto), true
		}
	}
	return egress, egLocal, ingress, inLocal
}

func chainAllows(rs *table.Ruleset, ch *table.Chain, peer netip.Addr, port uint16, proto table.Proto) bool {
	for _, cl := range ch.Clauses {
		if cl.Proto != table.ProtoAny && (cl.Proto != proto || (cl.PortFrom != 0 && (port < cl.PortFrom || port > cl.PortTo))) {
			continue
		}
		if cl.AnyPeer {
			return true
		}
		name := cl.Set4
		if peer.Is6() {
			name = cl.Set6
		}
		if name == "" {
			continue
		}
		for _, rg := range rs.Sets[name].Ranges {
			if !peer.Less(rg.From) && !rg.To.Less(peer) {
				return true
			}
		}
	}
	return false
}

func dumpPolicies(in Input) string {
	var b strings.Builder
	for _, p := range in.Policies {
		j, _ := json.Marshal(p.Spec)
		fmt.Fprintf(&b, "\n  %s/%s %s", p.Namespace, p.Name, j)
	}
	return b.String()
}

// randomWorld is a cluster of three namespaces and 10 pods (some dual
// stack, some local, one hostNetwork) with up to four random policies of
// every kind of selector, peer and port Compile reads.
func randomWorld(r *rand.Rand) Input {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	in := Input{Network: "kube", Namespaces: map[string]map[string]string{}, Local: map[string]bool{}}
	nss := []string{"n0", "n1", "n2"}
	for _, ns := range nss {
		in.Namespaces[ns] = map[string]string{"team": pick("x", "y")}
	}
	for i := range 10 {
		p := pod(pick(nss...), fmt.Sprintf("p%d", i), map[string]string{"app": pick("a", "b", "c")}, fmt.Sprintf("10.1.%d.%d", i%3, i+1))
		if r.IntN(2) == 0 {
			p.Labels["tier"] = pick("1", "2")
		}
		if r.IntN(2) == 0 {
			p.IPs = append(p.IPs, netip.MustParseAddr(fmt.Sprintf("fd00::%d", i+1)))
		}
		for _, np := range []NamedPort{{"http", table.ProtoTCP, 80}, {"http", table.ProtoTCP, 8080}, {"dns", table.ProtoUDP, 53}, {"s", table.ProtoSCTP, 9000}} {
			if r.IntN(3) == 0 {
				p.Ports = append(p.Ports, np)
			}
		}
		p.HostNetwork = i == 9
		in.Pods = append(in.Pods, p)
		if r.IntN(3) > 0 {
			in.Local[p.Key()] = true
		}
	}
	selector := func() *metav1.LabelSelector {
		switch r.IntN(4) {
		case 0:
			return &metav1.LabelSelector{}
		case 1:
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"1", "2"}}}}
		}
		return sel("app", pick("a", "b", "c"))
	}
	peer := func() networkingv1.NetworkPolicyPeer {
		switch r.IntN(6) {
		case 0:
			return networkingv1.NetworkPolicyPeer{PodSelector: selector()}
		case 1:
			return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", pick("x", "y"))}
		case 2:
			return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: selector()}
		case 3:
			return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/16", Except: []string{pick("10.1.1.0/24", "10.1.0.0/30")}}}
		case 4:
			return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/120", Except: []string{"fd00::4/126"}}}
		}
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", pick("x", "y")), PodSelector: selector()}
	}
	port := func() networkingv1.NetworkPolicyPort {
		var p networkingv1.NetworkPolicyPort
		if r.IntN(4) > 0 {
			p.Protocol = ptr([]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}[r.IntN(3)])
		}
		switch r.IntN(4) {
		case 0:
		case 1:
			p.Port = ptr(intstr.FromString(pick("http", "dns", "s")))
		default:
			n := []int32{53, 80, 443, 8080, 9000}[r.IntN(5)]
			p.Port = ptr(intstr.FromInt32(n))
			if r.IntN(3) == 0 {
				p.EndPort = ptr(n + int32(r.IntN(2000)))
			}
		}
		return p
	}
	list := func() ([]networkingv1.NetworkPolicyPeer, []networkingv1.NetworkPolicyPort) {
		var peers []networkingv1.NetworkPolicyPeer
		var ports []networkingv1.NetworkPolicyPort
		for range r.IntN(3) {
			peers = append(peers, peer())
		}
		for range r.IntN(3) {
			ports = append(ports, port())
		}
		return peers, ports
	}
	for i := range 1 + r.IntN(4) {
		spec := networkingv1.NetworkPolicySpec{PodSelector: *selector()}
		switch r.IntN(4) {
		case 1:
			spec.PolicyTypes = ingressOnly
		case 2:
			spec.PolicyTypes = egressOnly
		case 3:
			spec.PolicyTypes = both
		}
		for range r.IntN(3) {
			peers, ports := list()
			spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports})
		}
		for range r.IntN(3) {
			peers, ports := list()
			spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports})
		}
		in.Policies = append(in.Policies, policy(pick(nss...), fmt.Sprintf("pol%d", i), spec))
	}
	return in
}

// FuzzExplain builds the Model of arbitrary policy specs (JSON) over the
// test world: it must survive JSON unchanged, and Explain must answer
// (or refuse) every pair of ends without panicking, a verdict allowed
// exactly when both sides are.
func FuzzExplain(f *testing.F) {
	f.Add(`{"podSelector":{},"policyTypes":["Ingress","Egress"]}`, uint16(80), uint8(6))
	f.Add(`{"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.0.1.0/24"]}}],"ports":[{"protocol":"UDP","port":53,"endPort":60}]}]}`, uint16(55), uint8(17))
	f.Add(`{"podSelector":{},"egress":[{"to":[{"namespaceSelector":{},"podSelector":{"matchLabels":{"app":"api"}}}],"ports":[{"port":"http"}]}]}`, uint16(0), uint8(0))
	f.Fuzz(func(t *testing.T, spec string, port uint16, proto uint8) {
		var s networkingv1.NetworkPolicySpec
		if json.Unmarshal([]byte(spec), &s) != nil {
			return
		}
		m := roundTrip(t, BuildModel(world(policy("a", "f", s), policy("b", "f", s))))
		ends := []Endpoint{ipEnd("10.0.9.9"), ipEnd("fd00::9"), {IP: netip.MustParseAddr("192.168.50.1"), Node: true}}
		for _, p := range m.Pods {
			ends = append(ends, podEnd(p.Pod))
		}
		for _, a := range ends {
			for _, b := range ends {
				v, err := Explain(m, a, b, port, table.Proto(proto))
				if err == nil && port != 0 && v.Allowed != (v.Egress.Allowed && v.Ingress.Allowed) {
					t.Fatalf("%+v -> %+v: %+v", a, b, v)
				}
			}
		}
	})
}

// BenchmarkModel: what the controller adds to a compile that reaches the
// kernel (benchWorld: 100 policies, 1,000 pods): the model and its JSON.
func BenchmarkModel(b *testing.B) {
	in := benchWorld()
	for b.Loop() {
		if _, err := json.Marshal(BuildModel(in)); err != nil {
			b.Fatal(err)
		}
	}
}
