package attack_test

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
)

// TestNetpolSpoofedSource attacks the policy with source addresses a pod
// does not own (a pod with NET_ADMIN adds any address to its eth0; one
// with NET_RAW alone can forge it): policy decides by the packet's
// source address, so a forged one must not buy what the owner has.
//
//   - ingress: guard admits only friend; attacker takes friend's IPv4
//     and IPv6 addresses and connects from them;
//   - egress: jailed may send nothing (deny-all egress); it connects to
//     control from an address nobody holds;
//   - pending: pend (marked, not compiled) does the same.
//
// With networkPolicy on, every pod port has source checks
// (masq.SpoofCheck with the pod's addresses, as the plugin's ADD writes
// them): before they are in place the forged SYNs reach guard (the attack
// is real), after it every attack must go unanswered and the forged SYN
// never reach guard; in the same run friend reaches guard, the attacker
// reaches control, and attacker, jailed and pend are refused from their
// own addresses. A flushed bridge table comes back from the records
// (masq.Keep, as the agent runs it) with the checks in force.
func TestNetpolSpoofedSource(t *testing.T) {
	testenv.RequireRoot(t)
	t.Setenv("VILLAGE_RUN_DIR", t.TempDir())
	l := testenv.NewPodLab(t)
	for i, name := range []string{"attacker", "guard", "friend", "jailed", "pend", "control"} {
		l.AddPod(name, i+2, true)
	}
	in := labInput(l, []string{"attacker", "guard", "friend", "jailed", "control"}) // pend not seen yet
	sel := func(app string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	}
	friend := sel("friend")
	in.Policies = []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "guard"}, Spec: networkingv1.NetworkPolicySpec{PodSelector: sel("guard"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &friend}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "jail"}, Spec: networkingv1.NetworkPolicySpec{PodSelector: sel("jailed"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}},
	}
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

	// the forged addresses, held on the forgers' own eth0
	nobody := map[bool]string{false: "10.9.0.200", true: "fd09::c8"}
	nobody2 := map[bool]string{false: "10.9.0.201", true: "fd09::c9"}
	for _, v6 := range []bool{false, true} {
		addrs := map[bool]map[string]string{false: l.V4, true: l.V6}[v6]
		plen := map[bool]string{false: "/24", true: "/64"}[v6]
		testenv.MustIP(t, l.Pods["attacker"], "addr", "add", addrs["friend"]+plen, "dev", "eth0", "nodad")
		testenv.MustIP(t, l.Pods["jailed"], "addr", "add", nobody[v6]+plen, "dev", "eth0", "nodad")
		testenv.MustIP(t, l.Pods["pend"], "addr", "add", nobody2[v6]+plen, "dev", "eth0", "nodad")
	}

	// without source checks the forgery reaches guard
	for _, v6 := range []bool{false, true} {
		addrs := map[bool]map[string]string{false: l.V4, true: l.V6}[v6]
		c := testenv.StartCapture(t, l.Pods["guard"], "eth0", "tcp dst port 80")
		err := dialAs(l.Pods["attacker"], addrs["friend"], addrs["guard"])
		if out := c.Stop(); !strings.Contains(out, addrs["friend"]) {
			t.Fatalf("control: without source checks the attacker's SYNs as friend (%s) did not reach guard, so the attack below proves nothing (the dial: %v):\n%s", addrs["friend"], err, out)
		}
	}
	spoofChecks := func() {
		t.Helper()
		if err := testenv.InNS(l.Node, func() error {
			for name := range l.Pods {
				sc := masq.SpoofCheck{Network: "t", HostVeth: "veth-" + name,
					IPs: []netip.Addr{netip.MustParseAddr(l.V4[name]), netip.MustParseAddr(l.V6[name])}}
				if err := masq.EnsureSpoofCheck(sc); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	spoofChecks()
	// the control above taught guard friend's addresses at the attacker's
	// MAC (the forged neighbour solicitations and ARP): forget them, as
	// the kernel would once they went stale
	for _, n := range append(slices.Collect(maps.Values(l.Pods)), l.Node) {
		testenv.MustIP(t, n, "neigh", "flush", "all")
	}
	t.Cleanup(func() {
		_ = testenv.InNS(l.Node, func() error { return masq.Teardown("t") })
	})
	attacks(t, l, nobody, nobody2)

	// flushed, and put back from the records as the agent's Keep does
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(l.Node.Path()), "nft", "delete", "table", "bridge", masq.Table("t")).CombinedOutput(); err != nil {
		t.Fatalf("nft delete table bridge %s: %v: %s", masq.Table("t"), err, out)
	}
	if err := testenv.InNS(l.Node, func() error {
		_, err := masq.Keep(masq.Spec{Network: "t", SpoofCheck: true, NoMasquerade: true}, masq.Node{Bridge: "br0"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	attacks(t, l, nobody, nobody2)
}

// attacks runs the forged connections of TestNetpolSpoofedSource and its
// controls, over IPv4 and IPv6.
func attacks(t *testing.T, l *testenv.PodLab, nobody, nobody2 map[bool]string) {
	t.Helper()
	for _, v6 := range []bool{false, true} {
		addrs := map[bool]map[string]string{false: l.V4, true: l.V6}[v6]
		// positive controls
		mustReach(t, l.Pods["friend"], addrs["friend"], addrs["guard"], "friend -> guard")
		mustReach(t, l.Pods["attacker"], addrs["attacker"], addrs["control"], "attacker -> control")
		// refused from their own addresses
		mustDrop(t, l.Pods["attacker"], addrs["attacker"], addrs["guard"], "attacker -> guard")
		mustDrop(t, l.Pods["jailed"], addrs["jailed"], addrs["control"], "jailed -> control")
		mustDrop(t, l.Pods["pend"], addrs["pend"], addrs["control"], "pend -> control")
		// the attacks: the forged SYNs must not even reach guard (the
		// SYN-ACK may go to the real friend, so an unanswered connection
		// alone does not say the policy held)
		c := testenv.StartCapture(t, l.Pods["guard"], "eth0", "tcp dst port 80")
		mustDrop(t, l.Pods["attacker"], addrs["friend"], addrs["guard"], "ATTACK: attacker as friend -> guard")
		if out := c.Stop(); strings.Contains(out, addrs["friend"]) {
			t.Errorf("ATTACK: attacker's SYNs as friend (%s) reached guard past its policy:\n%s", addrs["friend"], out)
		}
		mustDrop(t, l.Pods["jailed"], nobody[v6], addrs["control"], "ATTACK: jailed from a forged source -> control")
		mustDrop(t, l.Pods["pend"], nobody2[v6], addrs["control"], "ATTACK: pend from a forged source -> control")
	}
}

// dialAs connects from n with source address src to dst:80 and reads the
// answer.
func dialAs(n ns.NetNS, src, dst string) error {
	return testenv.InNS(n, func() error {
		d := net.Dialer{Timeout: testenv.DialBound, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", net.JoinHostPort(dst, "80"))
		if err != nil {
			return err
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "ok" {
			return fmt.Errorf("answer %q: %v", b, err)
		}
		return nil
	})
}

func mustReach(t *testing.T, n ns.NetNS, src, dst, what string) {
	t.Helper()
	if err := dialAs(n, src, dst); err != nil {
		t.Errorf("control: %s (%s -> %s): %v", what, src, dst, err)
	}
}

// mustDrop: the connection goes unanswered (a refusal would mean the SYN
// got through).
func mustDrop(t *testing.T, n ns.NetNS, src, dst, what string) {
	t.Helper()
	err := dialAs(n, src, dst)
	if err == nil {
		t.Errorf("%s (%s -> %s): answered", what, src, dst)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Errorf("%s (%s -> %s): want no answer, got %v", what, src, dst, err)
	}
}
