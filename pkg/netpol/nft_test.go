package netpol

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/netpol/table"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/internal/testenv"
)

// lab is a test node: a netns with bridge br0 (nf_call_iptables and
// nf_call_ip6tables on, as Village sets its bridge) holding 10.9.0.1/24
// and fd09::1/64, and pods a, b, c on it, each with a TCP server on ports
// 80 and 8080.
type lab struct {
	t    *testing.T
	node ns.NetNS
	pods map[string]ns.NetNS
	v4   map[string]string
	v6   map[string]string
}

const dialBound = 3 * time.Second // a dropped SYN: the connect gives up after this

func newLab(t *testing.T) *lab {
	l := &lab{t: t, node: testenv.NewNS(t), pods: map[string]ns.NetNS{}, v4: map[string]string{}, v6: map[string]string{}}
	testenv.MustIP(t, l.node, "link", "add", "br0", "type", "bridge", "nf_call_iptables", "1", "nf_call_ip6tables", "1")
	testenv.MustIP(t, l.node, "addr", "add", "10.9.0.1/24", "dev", "br0")
	testenv.MustIP(t, l.node, "addr", "add", "fd09::1/64", "dev", "br0", "nodad")
	testenv.MustIP(t, l.node, "link", "set", "br0", "up")
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(l.node.Path()), "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v: %s", err, out)
	}
	for i, name := range []string{"a", "b", "c"} {
		p := testenv.NewNS(t)
		l.pods[name] = p
		l.v4[name] = fmt.Sprintf("10.9.0.%d", i+2)
		l.v6[name] = fmt.Sprintf("fd09::%d", i+2)
		host := "veth-" + name
		testenv.MustIP(t, l.node, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", p.Path())
		testenv.MustIP(t, l.node, "link", "set", host, "master", "br0", "up")
		testenv.MustIP(t, p, "addr", "add", l.v4[name]+"/24", "dev", "eth0")
		testenv.MustIP(t, p, "addr", "add", l.v6[name]+"/64", "dev", "eth0", "nodad")
		testenv.MustIP(t, p, "link", "set", "eth0", "up")
		testenv.MustIP(t, p, "route", "add", "default", "via", "10.9.0.1")
		testenv.MustIP(t, p, "-6", "route", "add", "default", "via", "fd09::1")
		for _, port := range []int{80, 8080} {
			testenv.ServeTCP(t, p, fmt.Sprintf("[::]:%d", port), "ok")
		}
	}
	if v4, v6 := testenv.BridgeNfCalls(t, l.node, "br0"); v4 != 1 || v6 != 1 {
		t.Fatalf("bridge nf_call options %d %d", v4, v6)
	}
	return l
}

// dial connects from netns n to addr:port and reads the server's answer.
func dial(n ns.NetNS, addr string, port int) error {
	return testenv.InNS(n, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, fmt.Sprint(port)), dialBound)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(dialBound))
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "ok" {
			return fmt.Errorf("answer %q: %v", b, err)
		}
		return nil
	})
}

// reach asserts which connections pass.
func (l *lab) reach(t *testing.T, from, to string, port int, want bool) {
	t.Helper()
	errs := make(chan func(), 2)
	for _, addrs := range []map[string]string{l.v4, l.v6} {
		go func() { errs <- l.check(from, to, addrs[to], port, want) }()
	}
	for range 2 {
		if f := <-errs; f != nil {
			f()
		}
	}
}

// check is one connection of reach; it returns the failure to report.
func (l *lab) check(from, to, dst string, port int, want bool) func() {
	{
		var src ns.NetNS
		if from == "node" {
			src = l.node
		} else {
			src = l.pods[from]
		}
		err := dial(src, dst, port)
		var msg string
		switch {
		case want && err != nil:
			msg = fmt.Sprintf("%s -> %s (%s) port %d: want allowed, got %v", from, to, dst, port, err)
		case !want && err == nil:
			msg = fmt.Sprintf("%s -> %s (%s) port %d: want denied, got through", from, to, dst, port)
		case !want && !isTimeout(err):
			msg = fmt.Sprintf("%s -> %s (%s) port %d: want a silent drop, got %v", from, to, dst, port, err)
		default:
			return nil
		}
		return func() { l.t.Error(msg) }
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// input is the lab as Compile sees it: every pod local, labelled
// app=<name>, all in namespace ns (labelled name=ns), port 8080 named
// "alt".
func (l *lab) input(pols ...*networkingv1.NetworkPolicy) Input {
	in := Input{Network: "t", Policies: pols, Local: map[string]bool{}, Namespaces: map[string]map[string]string{"ns": {"name": "ns"}}}
	for name := range l.pods {
		p := pod("ns", name, map[string]string{"app": name}, l.v4[name], l.v6[name])
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
	if err := testenv.InNS(l.node, func() error { return table.Apply(rs) }); err != nil {
		t.Fatal(err)
	}
	return rs
}

func nft(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(n.Path()), "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestEnforce proves the compiled tables on traffic bridged between pods
// of one node, IPv4 and IPv6: the inet forward hook sees it because the
// bridge calls netfilter.
func TestEnforce(t *testing.T) {
	l := newLab(t)
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
	if out := nft(t, l.node, "list", "chain", "inet", table.PolicyTable("t"), "in.ns/b"); !strings.Contains(out, "drop") || strings.Contains(out, "packets 0 ") {
		t.Errorf("the drop rule of b's ingress chain counted nothing:\n%s", out)
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
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.9.0.0/24", Except: []string{l.v4["c"] + "/32"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "fd09::/64", Except: []string{l.v6["c"] + "/128"}}}},
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
	if out := nft(t, l.node, "list", "table", "inet", table.PolicyTable("t")); strings.Contains(out, "in.ns/") || strings.Contains(out, "eg.ns/") {
		t.Errorf("per-pod chains left after the policies went:\n%s", out)
	}

	// Remove: nothing of either table is left.
	if err := testenv.InNS(l.node, func() error { return table.Remove("t") }); err != nil {
		t.Fatal(err)
	}
	if out := nft(t, l.node, "list", "tables"); strings.Contains(out, "village") {
		t.Errorf("tables left: %s", out)
	}
}

// TestPending: a marked address is unreachable (and cannot send) until an
// Apply compiles it, even with no policy at all.
func TestPending(t *testing.T) {
	l := newLab(t)
	b := []netip.Addr{netip.MustParseAddr(l.v4["b"]), netip.MustParseAddr(l.v6["b"])}
	mark := func() error { return testenv.InNS(l.node, func() error { return table.MarkPending("t", b) }) }
	if err := mark(); !errors.Is(err, table.ErrNoController) {
		t.Fatalf("marking with no controller: %v", err)
	}
	in := l.input()
	in.Local = map[string]bool{"ns/a": true, "ns/c": true} // b not seen yet
	l.apply(t, in)
	if err := mark(); err != nil {
		t.Fatal(err)
	}
	l.reach(t, "a", "b", 80, false)
	l.reach(t, "b", "c", 80, false)
	// an Apply that does not know b keeps the mark
	l.apply(t, in)
	l.reach(t, "a", "b", 80, false)
	var left []netip.Addr
	_ = testenv.InNS(l.node, func() (err error) { left, err = table.Pending("t"); return err })
	if len(left) != 2 {
		t.Fatalf("pending after an apply that did not compile b: %v", left)
	}
	l.apply(t, l.input())
	l.reach(t, "a", "b", 80, true)
	l.reach(t, "b", "c", 80, true)
	_ = testenv.InNS(l.node, func() (err error) { left, err = table.Pending("t"); return err })
	if len(left) != 0 {
		t.Fatalf("pending after compiling b: %v", left)
	}
}

type corev1Protocol = corev1.Protocol

func intOrString(v int32) intstr.IntOrString { return intstr.FromInt32(v) }
