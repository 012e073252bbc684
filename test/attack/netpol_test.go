package attack_test

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
)

// TestNetpolLinkLocal attacks a deny-all pod and a pending pod from a pod
// of the same node over every address family: IPv4, IPv6 global and IPv6
// link-local (fe80:: on eth0, derived from the victim's MAC as the
// attacker learns it from the neighbour table). The rules are the ones
// netpol.Compile makes and table.Apply installs (the controller's own
// path) on a node with a bridge that calls netfilter, as Village's does.
// Every attack must go unanswered (TCP connect and ping); in the same run
// the deny-all pod and an unselected control pod answer the attacker at
// their link-local addresses before the policy, the control answers at
// IPv4 and IPv6 after it, and the node reaches the deny-all pod (node
// traffic is allowed).
func TestNetpolLinkLocal(t *testing.T) {
	testenv.RequireRoot(t)
	l := testenv.NewPodLab(t)
	for i, name := range []string{"attacker", "deny", "pend", "control"} {
		l.AddPod(name, i+2, true)
	}
	ll := map[string]string{}
	for _, name := range []string{"deny", "pend", "control"} {
		ll[name] = linkLocalOf(t, l, name)
	}
	// positive control before any policy: the link-local path works
	for _, name := range []string{"deny", "control"} {
		testenv.WaitFor(t, "attacker reaches "+name+" at "+ll[name], func() error {
			return dial(l.Pods["attacker"], ll[name], time.Second)
		})
	}

	applyDenyAndPending(t, l)

	// positive controls in the same run
	// (link-local is dropped between every two pods of the bridge, so the
	// control answers there only before the policy, checked above)
	for _, dst := range []string{l.V4["control"], l.V6["control"]} {
		if err := dial(l.Pods["attacker"], dst, testenv.DialBound); err != nil {
			t.Errorf("control: attacker -> control %s: %v", dst, err)
		}
	}
	if err := dial(l.Node, l.V4["deny"], testenv.DialBound); err != nil {
		t.Errorf("control: node -> deny %s: %v (node traffic is allowed)", l.V4["deny"], err)
	}
	// the attacks
	for _, victim := range []string{"deny", "pend"} {
		for _, dst := range []string{l.V4[victim], l.V6[victim], ll[victim]} {
			attack(t, l.Pods["attacker"], "attacker", victim, dst)
		}
	}
}

// applyDenyAndPending installs, in the lab's node, the rules
// netpol.Compile makes for every pod of the lab but "pend" (labelled
// app=<name>, in namespace ns) with policy deny selecting app=deny
// (deny-all ingress), and marks pod "pend" pending as ADD does: the
// controller's own path (table.Apply, table.MarkPending).
func applyDenyAndPending(t *testing.T, l *testenv.PodLab) {
	t.Helper()
	in := labInput(l, slices.DeleteFunc(slices.Sorted(maps.Keys(l.Pods)), func(name string) bool { return name == "pend" })) // pend: not seen yet
	in.Policies = []*networkingv1.NetworkPolicy{denyIngress("deny")}
	rs := netpol.Compile(in)
	if err := testenv.InNS(l.Node, func() error {
		if err := table.Apply(rs); err != nil {
			return err
		}
		return table.MarkPending("t", []netip.Addr{netip.MustParseAddr(l.V4["pend"]), netip.MustParseAddr(l.V6["pend"])})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return table.Remove("t") }) })
}

// linkLocalOf is pod name's fe80:: address as a neighbour derives it: the
// attacker resolves the pod's IPv4 address (ARP is not filtered) and
// turns the MAC into the EUI-64 link-local address, with eth0 as its zone.
func linkLocalOf(t *testing.T, l *testenv.PodLab, name string) string {
	_ = dial(l.Pods["attacker"], l.V4[name], 200*time.Millisecond) // resolves the MAC
	var mac net.HardwareAddr
	testenv.WaitFor(t, "the attacker's neighbour entry of "+name, func() error {
		out, err := testenv.IP(l.Pods["attacker"], "neigh", "show", l.V4[name], "dev", "eth0")
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		for i := range f {
			if f[i] == "lladdr" && i+1 < len(f) {
				mac, err = net.ParseMAC(f[i+1])
				return err
			}
		}
		return fmt.Errorf("no lladdr in %q", out)
	})
	return fmt.Sprintf("fe80::%02x%02x:%02xff:fe%02x:%02x%02x%%eth0", mac[0]^2, mac[1], mac[2], mac[3], mac[4], mac[5])
}

func dial(n ns.NetNS, addr string, bound time.Duration) error {
	return testenv.Dial(n, addr, 80, bound)
}

// TestNetpolRoutedPeers attacks the same deny-all and pending pods over
// the routed path: from a peer whose traffic the node forwards from
// another interface, as it forwards a pod's of another node (out of the
// VXLAN device or a host-gw route) or a LAN host's. Each attack, TCP and
// ping over IPv4 and IPv6, must go unanswered (a link-local address is
// not routed: a peer off the bridge cannot even name the pod's); in the
// same run the peer reaches the unselected control pod at both addresses
// and port, and the node reaches both victims (node traffic is allowed,
// pending included).
func TestNetpolRoutedPeers(t *testing.T) {
	testenv.RequireRoot(t)
	l := testenv.NewPodLab(t)
	for i, name := range []string{"deny", "pend", "control"} {
		l.AddPod(name, i+2, true)
	}
	peer := routedPeer(t, l, 7)
	applyDenyAndPending(t, l)

	for _, dst := range []string{l.V4["control"], l.V6["control"]} {
		if err := dial(peer, dst, testenv.DialBound); err != nil {
			t.Errorf("control: routed peer -> control %s: %v", dst, err)
		}
	}
	for _, victim := range []string{"deny", "pend"} {
		for _, dst := range []string{l.V4[victim], l.V6[victim]} {
			if err := dial(l.Node, dst, testenv.DialBound); err != nil {
				t.Errorf("control: node -> %s %s: %v (node traffic is allowed)", victim, dst, err)
			}
			attack(t, peer, "routed peer", victim, dst)
		}
	}
}

// routedPeer is a namespace linked to the lab's node by a veth of its
// own, 10.9.n.2/24 and fd09:n::2/64 with the node at .1/::1 as its
// gateway: its packets to the pods are routed by the node, not bridged.
func routedPeer(t *testing.T, l *testenv.PodLab, n int) ns.NetNS {
	p := testenv.NewNS(t)
	host := fmt.Sprintf("rt%d", n)
	testenv.MustIP(t, l.Node, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", p.Path())
	testenv.MustIP(t, l.Node, "addr", "add", fmt.Sprintf("10.9.%d.1/24", n), "dev", host)
	testenv.MustIP(t, l.Node, "addr", "add", fmt.Sprintf("fd09:%d::1/64", n), "dev", host, "nodad")
	testenv.MustIP(t, l.Node, "link", "set", host, "up")
	testenv.MustIP(t, p, "addr", "add", fmt.Sprintf("10.9.%d.2/24", n), "dev", "eth0")
	testenv.MustIP(t, p, "addr", "add", fmt.Sprintf("fd09:%d::2/64", n), "dev", "eth0", "nodad")
	testenv.MustIP(t, p, "link", "set", "eth0", "up")
	testenv.MustIP(t, p, "route", "add", "default", "via", fmt.Sprintf("10.9.%d.1", n))
	testenv.MustIP(t, p, "-6", "route", "add", "default", "via", fmt.Sprintf("fd09:%d::1", n))
	return p
}

// attack connects and pings from src to dst, victim's address: both
// must go unanswered (a refusal would say the packet got through).
func attack(t *testing.T, src ns.NetNS, from, victim, dst string) {
	t.Helper()
	if err := dial(src, dst, testenv.DialBound); err == nil {
		t.Errorf("ATTACK: %s -> %s pod at %s: TCP connection answered", from, victim, dst)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("%s -> %s pod at %s: want no answer, got %v", from, victim, dst, err)
	}
	if err := testenv.Ping(src, dst, 2); err == nil {
		t.Errorf("ATTACK: %s -> %s pod at %s: ping answered", from, victim, dst)
	}
}

// labInput is the compile's input for pods names of l, each local,
// labelled app=<name> in namespace ns, on network "t" (no policies yet).
func labInput(l *testenv.PodLab, names []string) netpol.Input {
	in := netpol.Input{Network: "t", Bridge: "br0", Local: map[string]bool{}, Namespaces: map[string]map[string]string{"ns": {}}}
	for _, name := range names {
		p := &netpol.Pod{Namespace: "ns", Name: name, Labels: map[string]string{"app": name},
			IPs: []netip.Addr{netip.MustParseAddr(l.V4[name]), netip.MustParseAddr(l.V6[name])}}
		in.Pods = append(in.Pods, p)
		in.Local[p.Key()] = true
	}
	return in
}

// denyIngress is policy ns/deny, isolating app=<app> for ingress with no
// rule: nothing may reach it.
func denyIngress(app string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
}
