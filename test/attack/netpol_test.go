package attack_test

import (
	"fmt"
	"net"
	"net/netip"
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

	in := netpol.Input{Network: "t", Bridge: "br0", Local: map[string]bool{}, Namespaces: map[string]map[string]string{"ns": {}}}
	for _, name := range []string{"attacker", "deny", "control"} { // pend not seen yet
		p := &netpol.Pod{Namespace: "ns", Name: name, Labels: map[string]string{"app": name},
			IPs: []netip.Addr{netip.MustParseAddr(l.V4[name]), netip.MustParseAddr(l.V6[name])}}
		in.Pods = append(in.Pods, p)
		in.Local[p.Key()] = true
	}
	in.Policies = []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "deny"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}}
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
			if err := dial(l.Pods["attacker"], dst, testenv.DialBound); err == nil {
				t.Errorf("ATTACK: attacker -> %s pod at %s: TCP connection answered", victim, dst)
			} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				t.Errorf("attacker -> %s pod at %s: want no answer, got %v", victim, dst, err)
			}
			if err := testenv.Ping(l.Pods["attacker"], dst, 2); err == nil {
				t.Errorf("ATTACK: attacker -> %s pod at %s: ping answered", victim, dst)
			}
		}
	}
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
