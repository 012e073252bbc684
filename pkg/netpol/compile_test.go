package netpol

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/netpol/table"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func pod(ns, name string, lbl map[string]string, ips ...string) *Pod {
	p := &Pod{Namespace: ns, Name: name, Labels: lbl}
	for _, s := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(s))
	}
	return p
}

func policy(ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func tcp(p int) networkingv1.NetworkPolicyPort {
	proto := corev1.ProtocolTCP
	v := intstr.FromInt32(int32(p))
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

func named(proto corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

func ptr[T any](v T) *T { return &v }

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

// world is the cluster most cases use: namespace a (team=x) with pods
// a/web (app=web, local, dual stack, named port http=8080) and a/db
// (app=db, remote); namespace b (team=y) with b/client (local) and b/api
// (remote, port http=9090); c/lan is local with a LAN interface.
func world(pols ...*networkingv1.NetworkPolicy) Input {
	web := pod("a", "web", map[string]string{"app": "web"}, "10.0.1.2", "fd00::1:2")
	web.Ports = []NamedPort{{Name: "http", Protocol: table.ProtoTCP, Port: 8080}, {Name: "dns", Protocol: table.ProtoUDP, Port: 53}}
	api := pod("b", "api", map[string]string{"app": "api"}, "10.0.2.7")
	api.Ports = []NamedPort{{Name: "http", Protocol: table.ProtoTCP, Port: 9090}}
	lan := pod("c", "lan", map[string]string{"app": "lan"}, "10.0.1.9")
	lan.LAN = true
	host := pod("c", "host", map[string]string{"app": "host"}, "192.168.50.10")
	host.HostNetwork = true
	return Input{
		Network:  "kube",
		Policies: pols,
		Pods: []*Pod{web, pod("a", "db", map[string]string{"app": "db"}, "10.0.2.3"),
			pod("b", "client", map[string]string{"app": "client"}, "10.0.1.5", "fd00::1:5"), api, lan, host,
			pod("a", "pending", map[string]string{"app": "web"})},
		Namespaces: map[string]map[string]string{"a": {"team": "x"}, "b": {"team": "y"}, "c": {}},
		Local:      map[string]bool{"a/web": true, "b/client": true, "c/lan": true, "c/host": true, "a/pending": true},
	}
}

func TestCompile(t *testing.T) {
	cases := []struct {
		name string
		pols []*networkingv1.NetworkPolicy
		want string
	}{
		{"no policy", nil, ""},
		{"default deny ingress", []*networkingv1.NetworkPolicy{
			policy("a", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly}),
		}, "a/web in[] eg-\n"},
		{"default deny both, empty selector selects the namespace", []*networkingv1.NetworkPolicy{
			policy("b", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: both}),
		}, "b/client in[] eg[]\n"},
		{"no policyTypes: ingress, plus egress when it has egress rules", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{}}}),
		}, "a/web in[] eg[any]\n"},
		{"podSelector in the policy's namespace, both families", []*networkingv1.NetworkPolicy{
			policy("b", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: ingressOnly,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel()}}}}}),
		}, "b/client in[{10.0.1.5,10.0.2.7,fd00::1:5}] eg-\n"},
		{"namespaceSelector only", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y")}}}}}),
		}, "a/web in[{10.0.1.5,10.0.2.7,fd00::1:5}] eg-\n"},
		{"namespaceSelector and podSelector together", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: sel(), PodSelector: sel("app", "api")}}}}}),
		}, "a/web in[{10.0.2.7}] eg-\n"},
		{"ipBlock with except, ports by number and range, UDP, SCTP", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24", "10.0.3.0/25"}}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/64", Except: []string{"fd00::/65"}}}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(80),
						{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intstr.FromInt32(1000)), EndPort: ptr(int32(2000))},
						{Protocol: ptr(corev1.ProtocolSCTP)}},
				}}}),
		}, "a/web in[{10.0.0.0-10.0.0.255,10.0.2.0-10.0.2.255,10.0.3.128-10.0.255.255,fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff} tcp/80 | " +
			"{10.0.0.0-10.0.0.255,10.0.2.0-10.0.2.255,10.0.3.128-10.0.255.255,fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff} udp/1000-2000 | " +
			"{10.0.0.0-10.0.0.255,10.0.2.0-10.0.2.255,10.0.3.128-10.0.255.255,fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff} sctp] eg-\n"},
		{"named port on ingress resolves on the target pod", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
					named(corev1.ProtocolTCP, "http"), named(corev1.ProtocolUDP, "dns"), named(corev1.ProtocolTCP, "dns")}}}}),
		}, "a/web in[any tcp/8080 | any udp/53] eg-\n"},
		{"named port on egress resolves on each peer", []*networkingv1.NetworkPolicy{
			policy("b", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "http")}}}}),
		}, "b/client in- eg[{10.0.1.2,fd00::1:2} tcp/8080 | {10.0.2.7} tcp/9090]\n"},
		{"two policies add up, repeated clauses once", []*networkingv1.NetworkPolicy{
			policy("a", "p1", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}}),
			policy("a", "p2", networkingv1.NetworkPolicySpec{PodSelector: *sel(),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80), tcp(443)}}}}),
		}, "a/web in[any tcp/80 | any tcp/443] eg-\n"},
		{"a pod selected by nothing stays open; a remote pod is not compiled", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "db")}),
		}, ""},
		{"LAN and hostNetwork pods are problems", []*networkingv1.NetworkPolicy{
			policy("c", "deny", networkingv1.NetworkPolicySpec{}),
		}, "c/lan in[] eg-\n" +
			"problem NetworkPolicy c/deny: selects hostNetwork pod c/host, whose traffic is the node's own: not filtered\n" +
			"problem NetworkPolicy c/deny: selects pod c/lan, whose LAN interface (net1, macvlan) bypasses the node's netfilter: only its eth0 traffic is filtered\n"},
		{"a bad selector selects nothing and is a problem", []*networkingv1.NetworkPolicy{
			policy("a", "bad", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}}),
		}, "problem NetworkPolicy a/bad: spec.podSelector: \"Bogus\" is not a valid label selector operator: the policy selects no pod\n"},
		{"bad peers and ports match nothing and are problems", []*networkingv1.NetworkPolicy{
			policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "nonsense"}}, {}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.Protocol("ICMP"))}}}}}),
		}, "a/web in[] eg-\n" +
			"problem NetworkPolicy a/p: spec.ingress[0].from[0].ipBlock.cidr \"nonsense\": netip.ParsePrefix(\"nonsense\"): no '/': the peer matches nothing\n" +
			"problem NetworkPolicy a/p: spec.ingress[0].from[1]: empty peer: matches nothing\n" +
			"problem NetworkPolicy a/p: spec.ingress[0].ports[0]: protocol \"ICMP\": the port matches nothing\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs := Compile(world(tc.pols...))
			if got := rs.String(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
			// every local pod with an address is compiled, isolated or not
			if got := addrs(rs.Compiled); got != "10.0.1.2,10.0.1.5,10.0.1.9,fd00::1:2,fd00::1:5" {
				t.Errorf("compiled %s", got)
			}
		})
	}
}

func addrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

func TestSetNamesFollowTheRuleNotItsContent(t *testing.T) {
	pol := policy("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "web"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel()}}}}})
	in := world(pol)
	before := Compile(in)
	in.Pods = append(in.Pods, pod("b", "new", nil, "10.0.2.99"))
	after := Compile(in)
	if len(before.Pods) != 1 || len(after.Pods) != 1 || before.Pods[0].Ingress.Clauses[0] != after.Pods[0].Ingress.Clauses[0] {
		t.Fatalf("a new peer changed the rules: %v / %v", before.Pods, after.Pods)
	}
	name := after.Pods[0].Ingress.Clauses[0].Set4
	if n0, n1 := len(before.Sets[name].Ranges), len(after.Sets[name].Ranges); n1 != n0+1 {
		t.Errorf("set %s: %d elements, then %d", name, n0, n1)
	}
}

func TestNamespaces(t *testing.T) {
	rs := Compile(world(policy("b", "x", networkingv1.NetworkPolicySpec{}), policy("a", "y", networkingv1.NetworkPolicySpec{})))
	if got := strings.Join(rs.Namespaces, ","); got != "a,b" {
		t.Errorf("namespaces with policies: %s", got)
	}
}

func TestRanges(t *testing.T) {
	r := func(a, b string) table.Range {
		return table.Range{From: netip.MustParseAddr(a), To: netip.MustParseAddr(b)}
	}
	if got := prefixRange(netip.MustParsePrefix("10.1.2.3/8")); got != r("10.0.0.0", "10.255.255.255") {
		t.Errorf("prefixRange: %v", got)
	}
	if got := prefixRange(netip.MustParsePrefix("::/0")); got != r("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff") {
		t.Errorf("prefixRange: %v", got)
	}
	got := normalize([]table.Range{r("10.0.0.5", "10.0.0.9"), r("10.0.0.1", "10.0.0.4"), r("10.0.0.20", "10.0.0.30"), r("10.0.0.25", "10.0.0.26"), r("255.255.255.0", "255.255.255.255"), r("255.255.255.255", "255.255.255.255")})
	want := []table.Range{r("10.0.0.1", "10.0.0.9"), r("10.0.0.20", "10.0.0.30"), r("255.255.255.0", "255.255.255.255")}
	if len(got) != len(want) {
		t.Fatalf("normalize: %v", got)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("normalize: %v", got)
		}
	}
	all := r("0.0.0.0", "255.255.255.255")
	if got := subtract(all, []table.Range{all}); len(got) != 0 {
		t.Errorf("subtract everything: %v", got)
	}
	if got := subtract(all, []table.Range{r("0.0.0.0", "0.0.0.0"), r("255.255.255.255", "255.255.255.255")}); len(got) != 1 || got[0] != r("0.0.0.1", "255.255.255.254") {
		t.Errorf("subtract the ends: %v", got)
	}
}
