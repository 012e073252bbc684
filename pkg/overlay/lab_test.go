package overlay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// A lab is a LAN of namespaces: one "lan" namespace per L2 segment holding a
// bridge, nodes attached to a segment with a veth (their eth0), and on each
// node a pod namespace behind a veth (pod0 on the node, eth0 in the pod).
//
// Segment s (0, 1, ...) uses 192.168.(77+s).0/24 and fd(77+s)::/64; node i
// has .1i / ::1i on it; its pods use 10.244.i.0/24 and fd44:i::/64 (the pod
// is .2 / ::2, the node's pod0 the gateway .1 / ::1). Segments are joined by
// a router namespace at .1 / ::1 when there is more than one.

type segment struct {
	ns     ns.NetNS
	router bool
}

type labNode struct {
	name   string
	idx    int
	ns     ns.NetNS
	pod    ns.NetNS
	ip4    net.IP
	ip6    net.IP
	cidr4  *net.IPNet
	cidr6  *net.IPNet
	pod4   string
	pod6   string
	podMTU int
}

func nsName(n ns.NetNS) string { return filepath.Base(n.Path()) }

func mustCIDR(t testing.TB, s string) *net.IPNet {
	t.Helper()
	_, c, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sh(t testing.TB, n ns.NetNS, cmd string, args ...string) string {
	t.Helper()
	full := append([]string{"netns", "exec", nsName(n), cmd}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s in %s: %v: %s", cmd, strings.Join(args, " "), nsName(n), err, out)
	}
	return string(out)
}

func forwarding(t testing.TB, n ns.NetNS) {
	t.Helper()
	sh(t, n, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
		"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
}

// newSegments makes count LAN segments, joined by a router when count > 1.
func newSegments(t testing.TB, count int) []segment {
	t.Helper()
	segs := make([]segment, count)
	for i := range segs {
		segs[i].ns = testenv.NewNS(t)
		testenv.MustIP(t, segs[i].ns, "link", "add", "br0", "type", "bridge")
		testenv.MustIP(t, segs[i].ns, "link", "set", "br0", "up")
	}
	if count > 1 {
		router := testenv.NewNS(t)
		forwarding(t, router)
		for i := range segs {
			leg := fmt.Sprintf("leg%d", i)
			attach(t, router, leg, segs[i].ns, fmt.Sprintf("r%d", i))
			testenv.MustIP(t, router, "addr", "add", fmt.Sprintf("192.168.%d.1/24", 77+i), "dev", leg)
			testenv.MustIP(t, router, "addr", "add", fmt.Sprintf("fd%d::1/64", 77+i), "dev", leg, "nodad")
			segs[i].router = true
		}
	}
	return segs
}

// attach connects ifname in n to the bridge of segment namespace lan.
func attach(t testing.TB, n ns.NetNS, ifname string, lan ns.NetNS, port string) {
	t.Helper()
	testenv.MustIP(t, n, "link", "add", ifname, "type", "veth", "peer", "name", port, "netns", nsName(lan))
	testenv.MustIP(t, lan, "link", "set", port, "master", "br0", "up")
	testenv.MustIP(t, n, "link", "set", ifname, "up")
}

// addNode makes node idx (1..9) on segment seg.
func addNode(t testing.TB, segs []segment, seg, idx int) *labNode {
	t.Helper()
	n := &labNode{
		name:  fmt.Sprintf("node%d", idx),
		idx:   idx,
		ns:    testenv.NewNS(t),
		pod:   testenv.NewNS(t),
		ip4:   net.ParseIP(fmt.Sprintf("192.168.%d.1%d", 77+seg, idx)).To4(),
		ip6:   net.ParseIP(fmt.Sprintf("fd%d::1%d", 77+seg, idx)),
		cidr4: mustCIDR(t, fmt.Sprintf("10.244.%d.0/24", idx)),
		cidr6: mustCIDR(t, fmt.Sprintf("fd44:%d::/64", idx)),
		pod4:  fmt.Sprintf("10.244.%d.2", idx),
		pod6:  fmt.Sprintf("fd44:%d::2", idx),
	}
	forwarding(t, n.ns)
	attach(t, n.ns, "eth0", segs[seg].ns, fmt.Sprintf("n%d", idx))
	testenv.MustIP(t, n.ns, "addr", "add", n.ip4.String()+"/24", "dev", "eth0")
	testenv.MustIP(t, n.ns, "addr", "add", n.ip6.String()+"/64", "dev", "eth0", "nodad")
	if segs[seg].router {
		testenv.MustIP(t, n.ns, "route", "add", "default", "via", fmt.Sprintf("192.168.%d.1", 77+seg))
		testenv.MustIP(t, n.ns, "-6", "route", "add", "default", "via", fmt.Sprintf("fd%d::1", 77+seg))
	}
	sh(t, n.pod, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	testenv.MustIP(t, n.ns, "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", nsName(n.pod))
	testenv.MustIP(t, n.ns, "addr", "add", fmt.Sprintf("10.244.%d.1/24", idx), "dev", "pod0")
	testenv.MustIP(t, n.ns, "addr", "add", fmt.Sprintf("fd44:%d::1/64", idx), "dev", "pod0", "nodad")
	testenv.MustIP(t, n.ns, "link", "set", "pod0", "up")
	testenv.MustIP(t, n.pod, "addr", "add", n.pod4+"/24", "dev", "eth0")
	testenv.MustIP(t, n.pod, "addr", "add", n.pod6+"/64", "dev", "eth0", "nodad")
	testenv.MustIP(t, n.pod, "link", "set", "eth0", "up")
	testenv.MustIP(t, n.pod, "route", "add", "default", "via", fmt.Sprintf("10.244.%d.1", idx))
	testenv.MustIP(t, n.pod, "-6", "route", "add", "default", "via", fmt.Sprintf("fd44:%d::1", idx))
	return n
}

// setPodMTU sets both ends of the pod veth to mtu.
func (n *labNode) setPodMTU(t testing.TB, mtu int) {
	t.Helper()
	testenv.MustIP(t, n.ns, "link", "set", "pod0", "mtu", fmt.Sprint(mtu))
	testenv.MustIP(t, n.pod, "link", "set", "eth0", "mtu", fmt.Sprint(mtu))
	n.podMTU = mtu
}

// node is n as the overlay sees it, with an IPv4 or IPv6 underlay address.
func (n *labNode) node(v6Underlay bool) overlay.Node {
	ip := n.ip4
	if v6Underlay {
		ip = n.ip6
	}
	return overlay.Node{Name: n.name, IP: ip, PodCIDRs: []*net.IPNet{n.cidr4, n.cidr6}}
}

func newReconciler(t testing.TB, n ns.NetNS, cfg overlay.Config) *overlay.Reconciler {
	t.Helper()
	if cfg.Underlay == "" {
		cfg.Underlay = "eth0"
	}
	cfg.NetNS = n.Path()
	r, err := overlay.New(cfg)
	if err != nil {
		t.Fatalf("overlay.New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// cluster is one reconciler per node, each told about all nodes.
type cluster struct {
	nodes []*labNode
	recs  []*overlay.Reconciler
	v6    bool
}

func newCluster(t testing.TB, nodes []*labNode, cfg overlay.Config, v6Underlay bool) *cluster {
	t.Helper()
	c := &cluster{nodes: nodes, v6: v6Underlay}
	for _, n := range nodes {
		c.recs = append(c.recs, newReconciler(t, n.ns, cfg))
	}
	return c
}

func (c *cluster) all() []overlay.Node {
	var out []overlay.Node
	for _, n := range c.nodes {
		out = append(out, n.node(c.v6))
	}
	return out
}

// setAll runs Set on every node with every node as peers (self included:
// Set skips it) and returns the reports.
func (c *cluster) setAll(t testing.TB) []overlay.Report {
	t.Helper()
	var reps []overlay.Report
	for i, n := range c.nodes {
		rep, err := c.recs[i].Set(context.Background(), n.node(c.v6), c.all())
		if err != nil {
			t.Fatalf("Set on %s: %v", n.name, err)
		}
		reps = append(reps, rep)
	}
	return reps
}

// pingAll pings every other node's pod from every pod, over IPv4 and IPv6.
func (c *cluster) pingAll(t testing.TB) {
	t.Helper()
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a == b {
				continue
			}
			for _, dst := range []string{b.pod4, b.pod6} {
				if err := testenv.Ping(a.pod, dst, 2); err != nil {
					t.Errorf("%s pod -> %s pod: %v", a.name, b.name, err)
				}
			}
		}
	}
}

// capture records packets matching filter on every port of a segment until stop.
type capture struct{ *testenv.Capture }

func startCapture(t testing.TB, seg ns.NetNS, filter string) capture {
	t.Helper()
	return capture{testenv.StartCapture(t, seg, "any", filter)}
}

// stop ends the capture and returns the packet lines it printed.
func (c capture) stop() []string {
	var lines []string
	for _, l := range strings.Split(c.Stop(), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// kernelState is a node's owned state as iproute2 prints it, normalized.
type kernelState struct {
	Routes []string // "dst via gw dev onlink?"
	Neighs []string // "ip mac"
	FDB    []string // "mac dst"
}

func readState(t testing.TB, n ns.NetNS, dev string) kernelState {
	t.Helper()
	var st kernelState
	for _, fam := range []string{"-4", "-6"} {
		var routes []struct {
			Dst     string   `json:"dst"`
			Gateway string   `json:"gateway"`
			Dev     string   `json:"dev"`
			Flags   []string `json:"flags"`
		}
		decode(t, testenv.MustIP(t, n, "-j", fam, "route", "show", "table", "main", "proto", "86"), &routes)
		for _, r := range routes {
			s := fmt.Sprintf("%s via %s dev %s", r.Dst, r.Gateway, r.Dev)
			for _, f := range r.Flags {
				if f == "onlink" {
					s += " onlink"
				}
			}
			st.Routes = append(st.Routes, s)
		}
	}
	if _, err := testenv.IP(n, "link", "show", dev); err != nil {
		return st.sorted()
	}
	var neighs []struct {
		Dst    string   `json:"dst"`
		Lladdr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	decode(t, testenv.MustIP(t, n, "-j", "neigh", "show", "dev", dev, "nud", "permanent"), &neighs)
	for _, e := range neighs {
		st.Neighs = append(st.Neighs, e.Dst+" "+e.Lladdr)
	}
	var fdbs []struct {
		Mac   string `json:"mac"`
		Dst   string `json:"dst"`
		State string `json:"state"`
	}
	decode(t, sh(t, n, "bridge", "-j", "fdb", "show", "dev", dev), &fdbs)
	for _, e := range fdbs {
		if e.Dst != "" && e.State == "permanent" {
			st.FDB = append(st.FDB, e.Mac+" "+e.Dst)
		}
	}
	return st.sorted()
}

func (s kernelState) sorted() kernelState {
	sort.Strings(s.Routes)
	sort.Strings(s.Neighs)
	sort.Strings(s.FDB)
	return s
}

func decode(t testing.TB, out string, v any) {
	t.Helper()
	out = strings.TrimSpace(out)
	if out == "" {
		return
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
}
