package agent

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

func write(t testing.TB, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const registryList = `{"cniVersion":"1.1.0","name":"agt","plugins":[
	{"type":"loopback"},
	{"type":"village","clusterCIDR":"10.70.0.0/16","ipam":{"type":"village-ipam"},
	 "backend":{"type":"vxlan","underlay":"lan0","registry":{"endpoints":["http://192.0.2.1:2379"],"ttl":5}}},
	{"type":"portmap","capabilities":{"portMappings":true}}]}`

func TestAgentLoadConflist(t *testing.T) {
	f := write(t, "10-agt.conflist", registryList)
	c, err := Load(Options{ConfFile: f, NodeName: "n1", RunDir: "/tmp/run-x"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Net.Name != "agt" || c.Backend.Type != "vxlan" || c.Registry().TTL != 5 || c.Registry().SubnetLen != 24 || c.Registry().Prefix != "/village" {
		t.Fatalf("parsed: name %q backend %+v registry %+v", c.Net.Name, c.Backend, c.Registry())
	}
	if len(c.PodCIDRs) != 0 {
		t.Fatalf("no range in the list, got %v", c.PodCIDRs)
	}
	if c.SubnetFile != "/tmp/run-x/agt/subnet" {
		t.Fatalf("subnet file %s", c.SubnetFile)
	}
	sp, err := c.subnetSpace()
	if err != nil || sp.Cluster.String() != "10.70.0.0/16" || sp.Bits != 24 {
		t.Fatalf("space %+v %v", sp, err)
	}
}

// The etcd registry leases from one network: a dual-stack clusterCIDR
// with no IPAM range is refused, naming the way out, not leased in one
// family only.
func TestAgentSubnetSpaceDualStack(t *testing.T) {
	f := write(t, "10-agt.conflist", strings.Replace(registryList, `"10.70.0.0/16"`, `"10.70.0.0/16,fd70::/56"`, 1))
	c, err := Load(Options{ConfFile: f, NodeName: "n1", RunDir: "/tmp/run-x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.subnetSpace(); err == nil || !strings.Contains(err.Error(), "one per family") || !strings.Contains(err.Error(), "ipam ranges") {
		t.Fatalf("subnetSpace with a dual-stack clusterCIDR: %v, want a refusal naming ipam ranges", err)
	}
}

func TestAgentLoadRangesAndSingleConf(t *testing.T) {
	f := write(t, "10-one.conf", `{"cniVersion":"1.0.0","name":"one","type":"village",
		"ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.1.2.0/24"}],[{"subnet":"fd00:1:2::/64"}]],"subnetFile":"/elsewhere/s"},
		"backend":{"type":"host-gw","nodes":[{"name":"b","ip":"192.0.2.2","podCIDR":"10.1.3.0/24"}]}}`)
	c, err := Load(Options{ConfFile: f, NodeName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if cidrList(c.PodCIDRs) != "10.1.2.0/24,fd00:1:2::/64" || c.SubnetFile != "/elsewhere/s" {
		t.Fatalf("pod CIDRs %s, file %s", cidrList(c.PodCIDRs), c.SubnetFile)
	}
	if p := c.staticPeers(); len(p) != 1 || p[0].Name != "b" {
		t.Fatalf("static peers %+v", p)
	}
}

func TestAgentLoadErrors(t *testing.T) {
	for _, tc := range []struct{ name, text, opt, want string }{
		{"no village", `{"name":"x","plugins":[{"type":"bridge"}]}`, "n", `no plugin of type "village"`},
		{"other single", `{"name":"x","type":"bridge"}`, "n", `not village`},
		{"not json", `{`, "n", "not JSON"},
		{"bad node name", registryList, "a/b", "node name"},
		{"bad backend", `{"name":"x","type":"village","backend":{"type":"carrier-pigeon"}}`, "n", "carrier-pigeon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := write(t, "x.conflist", tc.text)
			_, err := Load(Options{ConfFile: f, NodeName: tc.opt})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Load(Options{ConfFile: "/nonexistent/x.conflist", NodeName: "n"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/x.conflist") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestAgentPublishAtomicAndIdempotent(t *testing.T) {
	dir := t.TempDir()
	c := &Conf{Node: "n1", SubnetFile: filepath.Join(dir, "agt", "subnet")}
	c.Net = mustNet(t)
	_, sn, _ := net.ParseCIDR("10.70.3.0/24")
	changed, err := c.publish([]*net.IPNet{sn})
	if err != nil || !changed {
		t.Fatalf("first publish: %v %v", changed, err)
	}
	got, err := c.publishedCIDRs()
	if err != nil || cidrList(got) != "10.70.3.0/24" {
		t.Fatalf("read back %v %v", got, err)
	}
	if changed, err := c.publish([]*net.IPNet{sn}); err != nil || changed {
		t.Fatalf("second publish rewrote: %v %v", changed, err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "agt"))
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	if st, _ := os.Stat(c.SubnetFile); st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", st.Mode())
	}
}

func mustNet(t *testing.T) *netconf.NetConf {
	t.Helper()
	f := write(t, "c.conflist", registryList)
	c, err := Load(Options{ConfFile: f, NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	return c.Net
}

func TestAgentPeersOfAndMerge(t *testing.T) {
	nodes := []registry.Node{
		{Name: "a", IP: "192.0.2.1", PodCIDRs: []string{"10.1.1.0/24"}},
		{Name: "self", IP: "192.0.2.9", PodCIDRs: []string{"10.1.9.0/24"}},
		{Name: "b", IP: "192.0.2.2", PodCIDRs: []string{"10.1.2.0/24"}, VtepMAC: "0e:76:00:00:00:02"},
		{Name: "bad", IP: "nope"},
	}
	peers, bad := peersOf(nodes, "self")
	if len(peers) != 2 || len(bad) != 1 || peers[1].VtepMAC.String() != "0e:76:00:00:00:02" {
		t.Fatalf("peers %+v bad %v", peers, bad)
	}
	_, sn, _ := net.ParseCIDR("10.1.7.0/24")
	static := []overlay.Node{{Name: "b", IP: net.ParseIP("192.0.2.22"), PodCIDRs: []*net.IPNet{sn}}}
	m := mergePeers(static, peers)
	if len(m) != 2 || m[0].IP.String() != "192.0.2.22" || m[1].Name != "a" {
		t.Fatalf("merge: %+v", m)
	}
	r := record("self", net.ParseIP("192.0.2.9"), []*net.IPNet{sn}, wgID{})
	if r.VtepMAC != overlay.DeriveMAC(net.ParseIP("192.0.2.9")).String() || r.PodCIDRs[0] != "10.1.7.0/24" {
		t.Fatalf("record %+v", r)
	}
}

func TestAgentDescribe(t *testing.T) {
	ch := overlay.Change{Op: overlay.OpAdd, Object: overlay.Object{Kind: overlay.KindRoute, Desc: "10.1.2.0/24 via 10.1.2.0 dev village.1 onlink", Peer: "b"}}
	if got := describe(ch); got != "missing route 10.1.2.0/24 via 10.1.2.0 dev village.1 onlink" {
		t.Fatal(got)
	}
}

// A batch of changes changes only the peers it names; a full batch makes
// the view the list, whatever the batches before it left; this node and
// records that do not convert never become peers.
func TestAgentApplyBatch(t *testing.T) {
	c, err := Load(Options{ConfFile: write(t, "c.conflist", registryList), NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	n := &node{c: c}
	rec := func(name, ip, cidr string) registry.Node {
		return registry.Node{Name: name, IP: ip, PodCIDRs: []string{cidr}}
	}
	view := peerMap(c.staticPeers())
	names := func(ps []overlay.Node) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.Name)
		}
		return strings.Join(s, ",")
	}
	ch, bad := n.applyBatch(view, registry.Batch{Full: true, Nodes: []registry.Node{
		rec("a", "192.0.2.1", "10.1.1.0/24"), rec("b", "192.0.2.2", "10.1.2.0/24"), rec("self", "192.0.2.9", "10.1.9.0/24"),
	}})
	if names(ch.Added) != "a,b" || len(ch.Updated)+len(ch.Removed)+len(bad) != 0 || len(view) != 2 {
		t.Fatalf("first full batch: %+v bad %v view %v", ch, bad, view)
	}
	ch, bad = n.applyBatch(view, registry.Batch{
		Nodes:   []registry.Node{rec("a", "192.0.2.11", "10.1.1.0/24"), rec("c", "192.0.2.3", "10.1.3.0/24"), rec("d", "nope", "10.1.4.0/24"), rec("self", "192.0.2.19", "10.1.9.0/24")},
		Removed: []string{"b", "unknown", "self"},
	})
	if names(ch.Added) != "c" || names(ch.Updated) != "a" || names(ch.Removed) != "b" || len(bad) != 1 {
		t.Fatalf("change batch: %+v bad %v", ch, bad)
	}
	if len(view) != 2 || view["a"].IP.String() != "192.0.2.11" {
		t.Fatalf("view after the changes: %v", view)
	}
	ch, _ = n.applyBatch(view, registry.Batch{Nodes: []registry.Node{rec("a", "192.0.2.11", "10.1.1.0/24")}})
	if !ch.Empty() {
		t.Fatalf("a record put again as it was changed %+v", ch)
	}
	// A full batch after a lost change: c is gone, e came, a is as it was.
	ch, _ = n.applyBatch(view, registry.Batch{Full: true, Nodes: []registry.Node{rec("a", "192.0.2.11", "10.1.1.0/24"), rec("e", "192.0.2.5", "10.1.5.0/24")}})
	if names(ch.Added) != "e" || names(ch.Removed) != "c" || len(ch.Updated) != 0 || names(peerList(view)) != "a,e" {
		t.Fatalf("full batch after changes: %+v view %v", ch, view)
	}
}

// TestFullPassCadence: while the kernel watch has seen everything and
// the last pass succeeded, a tick reads nothing back (the notifications
// and the safety net cover the kernel); a lost notification, a
// subscription down, no watch at all or a failed pass make the next tick
// a full one.
func TestFullPassCadence(t *testing.T) {
	w := newKernelWatch(nil, nil, t.Logf)
	w.down.Store(0)
	a := &agent{watch: w}
	var got []bool
	tick := func(n int) {
		for range n {
			got = append(got, a.fullDue())
		}
	}
	tick(8)
	want := make([]bool, 8)
	w.lost.Store(true) // a subscription ended and was made again
	tick(2)
	want = append(want, true, false)
	w.down.Store(1) // one is down: every tick
	tick(2)
	want = append(want, true, true)
	w.down.Store(0)
	tick(1)
	want = append(want, false)
	a.failed = true // a failed pass
	tick(2)
	want = append(want, true, true)
	a.failed = false // the full pass succeeded
	tick(1)
	want = append(want, false)
	if !slices.Equal(got, want) {
		t.Fatalf("full passes on ticks %v, want %v", got, want)
	}
	if b := (&agent{}); !b.fullDue() {
		t.Fatal("no kernel watch: the tick must read everything")
	}
}

// TestSafetyNet: the safety net has its default, is never shorter than
// the period, and each wait is drawn between 0.8 and 1.2 of it.
func TestSafetyNet(t *testing.T) {
	for _, c := range []struct{ period, net, want time.Duration }{
		{0, 0, DefaultSafetyNet},
		{10 * time.Second, 0, DefaultSafetyNet},
		{time.Hour, 0, time.Hour},
		{time.Hour, time.Minute, time.Hour},
		{time.Second, time.Minute, time.Minute},
	} {
		if got := (Options{Period: c.period, SafetyNet: c.net}).safetyNet(); got != c.want {
			t.Errorf("period %s, safety net %s: %s, want %s", c.period, c.net, got, c.want)
		}
	}
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := jittered(time.Minute)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 48*time.Second || hi > 72*time.Second || hi-lo < 10*time.Second {
		t.Fatalf("jittered(1m) ranged over [%s, %s], want within [48s, 72s] and spread", lo, hi)
	}
}

// TestEveryFeatureStartsAndReports: every feature `villaged status`
// reports is started by Run, once (early or late), and none is started
// that status leaves out.
func TestEveryFeatureStartsAndReports(t *testing.T) {
	started := map[string]int{}
	for _, f := range append(append([]feature{}, early...), late...) {
		started[f.Name()]++
	}
	reported := map[string]int{}
	for _, f := range features() {
		reported[f.Name()]++
	}
	if !maps.Equal(started, reported) {
		t.Fatalf("started %v, reported %v", started, reported)
	}
	for name, n := range started {
		if n != 1 {
			t.Errorf("feature %s started %d times", name, n)
		}
	}
	if last := late[len(late)-1].Name(); last != (overlayFeature{}).Name() {
		t.Errorf("the last feature started is %s: the overlay's loop asks the features before it (the masquerade keeper) for passes", last)
	}
}
