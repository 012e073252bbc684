package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
)

// TestBandwidthOnlyItsPod: the shipped conflist (conf/10-village.conflist:
// village, portmap, then the reference bandwidth plugin with the bandwidth
// capability) on one node, two pods on its bridge. Pod a asks for 8 Mbit/s
// each way in runtimeConfig, what a Kubernetes runtime passes for the
// kubernetes.io/ingress-bandwidth and egress-bandwidth annotations; pod b
// asks nothing. Measured with iperf3: a receives and sends at about the
// limit, while b, beside it on the same bridge, runs at veth speed both
// ways; b's host veth and the bridge carry no qdisc or filter, a's carries
// its own; after a's DEL its ifb device is gone. A pod never shapes
// another pod's traffic.
func TestBandwidthOnlyItsPod(t *testing.T) {
	n := NewNode(t)
	l := shippedList(t, n, nil)
	if last := l.Plugins[len(l.Plugins)-1].Network; last.Type != "bandwidth" || !last.Capabilities["bandwidth"] {
		t.Fatalf("the shipped conflist's last plugin is %+v, want bandwidth with the bandwidth capability", last)
	}
	const rate = 8_000_000 // bits per second each way
	shaped := map[string]any{"bandwidth": map[string]any{
		"ingressRate": rate, "ingressBurst": 100_000, "egressRate": rate, "egressBurst": 100_000}}
	a, b := n.NewPod(), n.NewPod()
	ra := addCaps(t, n, l, a, shaped)
	rb := addCaps(t, n, l, b, nil)
	vethA, vethB := hostVeth(t, ra), hostVeth(t, rb)
	ipA, ipB := ra.IPs[0].Address.IP.String(), rb.IPs[0].Address.IP.String()
	gw := ra.IPs[0].Gateway.String()

	// What the kernel holds: a's host veth its token bucket (the ingress
	// limit) and its ingress redirect to one ifb (the egress limit); b's
	// veth and the bridge nothing.
	if kinds := qdiscKinds(t, n.NS, vethA); !strings.Contains(kinds, "tbf") || !strings.Contains(kinds, "ingress") {
		t.Fatalf("pod a's host veth %s has qdiscs %q, want tbf and ingress", vethA, kinds)
	}
	ifbs := inNS(t, n.NS, "ip", "-o", "link", "show", "type", "ifb")
	if strings.Count(ifbs, "\n") != 1 {
		t.Fatalf("ifb devices on the node after the two ADDs: %q, want pod a's alone", ifbs)
	}
	for _, dev := range []string{vethB, "village0"} {
		if kinds := qdiscKinds(t, n.NS, dev); kinds != "noqueue" {
			t.Fatalf("%s carries qdiscs %q, want only its default noqueue: pod a's limit reached it", dev, kinds)
		}
		if f := inNS(t, n.NS, "tc", "filter", "show", "dev", dev, "ingress"); strings.TrimSpace(f) != "" {
			t.Fatalf("%s carries ingress filters: %s", dev, f)
		}
	}

	// The limits in traffic, not in text. Generous bounds: the shaped rate
	// within 0.5x..1.5x of the limit, the unshaped one above 10x.
	aIn := tcpRate(t, a.NS, ipA, n.NS)
	aOut := tcpRate(t, n.NS, gw, a.NS)
	bIn := tcpRate(t, b.NS, ipB, n.NS)
	bOut := tcpRate(t, n.NS, gw, b.NS)
	t.Logf("pod a (8 Mbit/s each way): node -> a %.1f Mbit/s, a -> node %.1f Mbit/s; pod b beside it (no limit): node -> b %.1f Mbit/s, b -> node %.1f Mbit/s",
		aIn/1e6, aOut/1e6, bIn/1e6, bOut/1e6)
	for _, m := range []struct {
		what string
		got  float64
	}{{"node -> pod a", aIn}, {"pod a -> node", aOut}} {
		if m.got < rate/2 || m.got > rate*3/2 {
			t.Errorf("%s at %.1f Mbit/s, want about its 8 Mbit/s limit (4..12)", m.what, m.got/1e6)
		}
	}
	for _, m := range []struct {
		what string
		got  float64
	}{{"node -> pod b", bIn}, {"pod b -> node", bOut}} {
		if m.got <= 10*rate {
			t.Errorf("%s at %.1f Mbit/s, want above 80: pod b asked for no limit", m.what, m.got/1e6)
		}
	}

	ctx := context.Background()
	must(t, n.in(func() error { return n.CNI.CheckNetworkList(ctx, l, a.rtCaps(shaped)) }), "CHECK of pod a with its limits")
	must(t, n.Check(l, b), "CHECK of pod b")
	must(t, n.in(func() error { return n.CNI.DelNetworkList(ctx, l, a.rtCaps(shaped)) }), "DEL of pod a")
	if left := inNS(t, n.NS, "ip", "-o", "link", "show", "type", "ifb"); strings.TrimSpace(left) != "" {
		t.Fatalf("pod a's ifb outlived its DEL: %s", left)
	}
	must(t, n.Del(l, b), "DEL of pod b")
}

// addCaps is ADD of p with the runtime's capability arguments caps.
func addCaps(t *testing.T, n *Node, l *libcni.NetworkConfigList, p *Pod, caps map[string]any) *current.Result {
	t.Helper()
	var r types.Result
	must(t, n.in(func() (err error) { r, err = n.CNI.AddNetworkList(context.Background(), l, p.rtCaps(caps)); return err }),
		"ADD of %s with %v", p.ID, caps)
	res, err := current.NewResultFromResult(r)
	must(t, err, "ADD of %s: its result", p.ID)
	return res
}

// rtCaps is p's runtime configuration with caps as its capability
// arguments.
func (p *Pod) rtCaps(caps map[string]any) *libcni.RuntimeConf {
	rt := p.rt()
	rt.CapabilityArgs = caps
	return rt
}

// hostVeth is the pod's host-side veth in its ADD result: the interface
// outside the pod that is not the bridge.
func hostVeth(t *testing.T, r *current.Result) string {
	t.Helper()
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && strings.HasPrefix(i.Name, "veth") {
			return i.Name
		}
	}
	t.Fatalf("no host veth in the result's interfaces %+v", r.Interfaces)
	return ""
}

// qdiscKinds is the kinds of dev's qdiscs in ns, comma separated.
func qdiscKinds(t *testing.T, n ns.NetNS, dev string) string {
	t.Helper()
	var qs []struct {
		Kind string `json:"kind"`
	}
	out := inNS(t, n, "tc", "-j", "qdisc", "show", "dev", dev)
	must(t, json.Unmarshal([]byte(out), &qs), "decoding tc -j qdisc show dev %s: %s", dev, out)
	var kinds []string
	for _, q := range qs {
		kinds = append(kinds, q.Kind)
	}
	return strings.Join(kinds, ",")
}
