package e2e

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/village"
)

// driftPod is one pod for a CHECK drift case and the names its messages use.
type driftPod struct {
	n    *Node
	p    *Pod
	veth string // host veth
	mac  string // eth0's MAC in the ADD result
}

const (
	recreate = "delete and re-create the pod (CNI DEL, then ADD) to restore it"
	// The pod's two routes as CHECK names them: one without a gateway in
	// the config, one with.
	defaultMissing = "route 0.0.0.0/0 is missing"
	svcMissing     = "route 10.96.0.0/12 via 10.244.1.1 is missing"
)

// TestCheckDriftCodesAndMessages breaks one thing at a time after ADD and
// asserts the exact CNI error CHECK returns through the real binary (libcni
// decodes the plugin's error JSON): a Village code (110 pod, 111 node only)
// and a message that says where, what, and what to do.
func TestCheckDriftCodesAndMessages(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(t *testing.T, d driftPod)
		code   uint
		// msg is the text after "CHECK of "eth0" in container "<id>" found
		// drift " with {netns}, {veth} and {mac} standing for the pod's
		// netns, its host veth and eth0's MAC.
		msg string
	}{
		{"interface gone", func(t *testing.T, d driftPod) { testenv.MustIP(t, d.p.NS, "link", "del", "eth0") },
			village.ErrCodePodDrift,
			`in the pod (netns {netns}): interface "eth0" is missing; ` + defaultMissing + "; " + svcMissing +
				`, and on the node: host veth "{veth}" is missing; ` + recreate},
		{"interface down", func(t *testing.T, d driftPod) { testenv.MustIP(t, d.p.NS, "link", "set", "eth0", "down") },
			village.ErrCodePodDrift,
			`in the pod (netns {netns}): interface "eth0" is down; ` + defaultMissing + "; " + svcMissing + "; " + recreate},
		{"MAC changed", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.p.NS, "link", "set", "eth0", "address", "02:00:00:00:00:01")
		}, village.ErrCodePodDrift,
			`in the pod (netns {netns}): interface "eth0" has MAC 02:00:00:00:00:01 where ADD set {mac}; ` + recreate},
		{"address gone", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.p.NS, "addr", "del", "10.244.1.2/24", "dev", "eth0")
		}, village.ErrCodePodDrift,
			`in the pod (netns {netns}): address 10.244.1.2/24 is missing from "eth0"; ` + defaultMissing + "; " + svcMissing + "; " + recreate},
		{"default route gone (no gateway in the config)", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.p.NS, "route", "del", "default")
		}, village.ErrCodePodDrift,
			`in the pod (netns {netns}): ` + defaultMissing + "; " + recreate},
		{"route with a gateway gone", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.p.NS, "route", "del", "10.96.0.0/12")
		}, village.ErrCodePodDrift,
			`in the pod (netns {netns}): ` + svcMissing + "; " + recreate},
		{"bridge gone", func(t *testing.T, d driftPod) { testenv.MustIP(t, d.n.NS, "link", "del", "village0") },
			village.ErrCodeNodeDrift,
			`on the node: bridge "village0" is missing; ` + recreate},
		{"bridge replaced by a veth", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.n.NS, "link", "del", "village0")
			testenv.MustIP(t, d.n.NS, "link", "add", "village0", "type", "veth", "peer", "name", "impostor")
		}, village.ErrCodeNodeDrift,
			`on the node: "village0" is a veth, not a bridge; ` + recreate},
		{"host veth off the bridge", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.n.NS, "link", "set", d.veth, "nomaster")
		}, village.ErrCodeNodeDrift,
			`on the node: host veth "{veth}" is not attached to bridge "village0"; ` + recreate},
		{"gateway address gone", func(t *testing.T, d driftPod) {
			testenv.MustIP(t, d.n.NS, "addr", "del", "10.244.1.1/24", "dev", "village0")
		}, village.ErrCodeNodeDrift,
			`on the node: gateway 10.244.1.1/24 is missing from bridge "village0"; ` + recreate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, l := newDriftPod(t)
			c.break_(t, d)
			err := d.n.Check(l, d.p)
			want := fmt.Sprintf(`CHECK of "eth0" in container %q found drift `, d.p.ID) + strings.NewReplacer("{netns}", d.p.NS.Path(), "{veth}", d.veth, "{mac}", d.mac).Replace(c.msg)
			assertCNIError(t, err, c.code, want)
		})
	}
	// Masquerade: the rule text is package masq's; the frame, the code and
	// the advice are CHECK's. CHECK writes nothing, so a second CHECK finds
	// the same; the next ADD repairs.
	// The nftables backend is the automatic choice on this iptables-nft host.
	t.Run("masquerade flushed", func(t *testing.T) {
		d, l := newDriftPod(t)
		if r := inNS(t, d.n.NS, "nft", "list", "ruleset"); !strings.Contains(r, "table inet village-drift") {
			t.Fatalf("no masquerade table to flush after ADD:\n%s", r)
		}
		inNS(t, d.n.NS, "nft", "flush", "ruleset")
		want := fmt.Sprintf(`CHECK of "eth0" in container %q found drift on the node: masquerade table inet village-drift of network "drift" missing from nftables; `, d.p.ID) +
			"the next ADD on this node or `villaged sync` restores the netfilter rules (`villaged run` does within 10 s); find what flushed them (a firewall reload?)"
		for _, which := range []string{"CHECK after nft flush ruleset", "a second CHECK"} {
			before := netfilterState(t, d.n.NS)
			assertCNIError(t, d.n.Check(l, d.p), village.ErrCodeNodeDrift, want)
			if after := netfilterState(t, d.n.NS); after != before {
				t.Fatalf("%s changed the node's netfilter state:\nbefore:\n%s\nafter:\n%s", which, before, after)
			}
		}
		d.n.MustAdd(l, d.n.NewPod())
		must(t, d.n.Check(l, d.p), "CHECK after the next ADD restored the rules")
	})
}

func assertCNIError(t *testing.T, err error, code uint, msg string) {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("CHECK: %v (%T), want a CNI error with code %d", err, err, code)
	}
	if msg = village.ErrorPrefix(village.Plugin, code) + msg; te.Code != code || te.Msg != msg {
		t.Fatalf("CHECK: code %d\n  %s\nwant code %d\n  %s", te.Code, te.Msg, code, msg)
	}
}

// newDriftPod adds one pod on a fresh node with a conflist whose pod has a
// default route without gateway and a service route with one.
func newDriftPod(t *testing.T) (driftPod, *libcni.NetworkConfigList) {
	n := NewNode(t)
	l := ConfList(t, fmt.Sprintf(`{"cniVersion": "1.1.0", "name": "drift", "plugins": [{
		"type": "village", "bridge": "village0", "isGateway": true, "ipMasq": true,
		"ipam": {"type": "village-ipam", "dataDir": %q, "ranges": [[{"subnet": "10.244.1.0/24"}]],
			"routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.96.0.0/12", "gw": "10.244.1.1"}]}}]}`, filepath.Join(n.Dir, "ipam")))
	p := n.NewPod()
	r := n.MustAdd(l, p)
	d := driftPod{n: n, p: p, veth: netsetup.HostVethName(p.ID, p.IfName)}
	for _, i := range r.Interfaces {
		if i.Name == "eth0" && i.Sandbox != "" {
			d.mac = i.Mac
		}
	}
	if r.IPs[0].Address.String() != "10.244.1.2/24" || d.mac == "" {
		t.Fatalf("ADD result: %s", r)
	}
	must(t, n.Check(l, p), "CHECK right after ADD")
	return d, l
}
