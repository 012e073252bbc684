package overlay_test

// Scale measurements. Run with
//
//	go test ./pkg/overlay/ -run '^$' -bench . -benchtime 5x
//
// BenchmarkSet1000FromNothing: one Set of 1000 VXLAN peers (3000 objects:
// route, neighbour, FDB entry each) on a node that has none.
// BenchmarkSetOneChangeOn1000: one peer moved to another underlay address on
// top of 1000 (3 writes plus the dumps).
// BenchmarkUpdateOneMovedOn1000: the same move as a known change through
// Update (no dumps: the peer's neighbour and FDB entries, the old FDB entry
// removed).
// BenchmarkIPBatch1000: the floor, the same 3000 objects written by
// `ip -batch` and `bridge -batch` (process start included).
// TestMeasureScale logs the same figures once per test run.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

const scalePeers = 1000

// scaleNode is a namespace with an underlay eth0 (a veth whose peer stays in
// the same namespace) and a reconciler on it.
type scaleNode struct {
	ns   ns.NetNS
	r    *overlay.Reconciler
	self overlay.Node
}

func newScaleNode(tb testing.TB) *scaleNode {
	tb.Helper()
	n := testenv.NewNS(tb)
	testenv.MustIP(tb, n, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	testenv.MustIP(tb, n, "addr", "add", "192.168.77.11/24", "dev", "eth0")
	testenv.MustIP(tb, n, "link", "set", "eth0", "up")
	testenv.MustIP(tb, n, "link", "set", "eth0p", "up")
	self := overlay.Node{Name: "self", IP: net.ParseIP("192.168.77.11").To4(),
		PodCIDRs: []*net.IPNet{{IP: net.IPv4(10, 244, 1, 0).To4(), Mask: net.CIDRMask(24, 32)}}}
	return &scaleNode{ns: n, r: newReconciler(tb, n, overlay.Config{Mode: overlay.ModeVXLAN}), self: self}
}

func (s *scaleNode) set(tb testing.TB, peers []overlay.Node) time.Duration {
	tb.Helper()
	start := time.Now()
	if _, err := s.r.Set(context.Background(), s.self, peers); err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// reset removes the device and its routes (untimed).
func (s *scaleNode) reset(tb testing.TB) {
	tb.Helper()
	if _, err := s.r.Teardown(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

// moved is peers with peer 500 on another underlay address.
func moved(peers []overlay.Node, round int) []overlay.Node {
	out := append([]overlay.Node(nil), peers...)
	out[500].IP = net.IPv4(10, 61, byte(round>>8), byte(round)).To4()
	return out
}

// batchFiles writes the same objects Set makes for peers as iproute2 batch
// files: one for `ip -batch` (neighbours, routes), one for `bridge -batch`.
func batchFiles(tb testing.TB, peers []overlay.Node) (ipFile, bridgeFile string) {
	var ipb, brb strings.Builder
	for _, p := range peers {
		mac := overlay.DeriveMAC(p.IP)
		fmt.Fprintf(&brb, "fdb replace %s dev village.1 dst %s self permanent\n", mac, p.IP)
		for _, c := range p.PodCIDRs {
			fmt.Fprintf(&ipb, "neigh replace %s lladdr %s dev village.1 nud permanent\n", c.IP, mac)
			fmt.Fprintf(&ipb, "route replace %s via %s dev village.1 onlink proto 86\n", c, c.IP)
		}
	}
	dir := tb.TempDir()
	ipFile, bridgeFile = filepath.Join(dir, "ip.batch"), filepath.Join(dir, "bridge.batch")
	if err := os.WriteFile(ipFile, []byte(ipb.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(bridgeFile, []byte(brb.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return ipFile, bridgeFile
}

// ipBatch times writing the batch files into the node (the device must exist).
func (s *scaleNode) ipBatch(tb testing.TB, ipFile, bridgeFile string) time.Duration {
	tb.Helper()
	start := time.Now()
	for _, args := range [][]string{
		{"-n", nsName(s.ns), "-batch", ipFile},
		{"netns", "exec", nsName(s.ns), "bridge", "-batch", bridgeFile},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	return time.Since(start)
}

// emptyDevice leaves the VXLAN device in place with nothing on it.
func (s *scaleNode) emptyDevice(tb testing.TB) {
	tb.Helper()
	s.reset(tb)
	s.set(tb, nil)
}

func BenchmarkSet1000FromNothing(b *testing.B) {
	s := newScaleNode(b)
	peers := fakePeers(scalePeers)
	for b.Loop() {
		b.StopTimer()
		s.reset(b)
		b.StartTimer()
		s.set(b, peers)
	}
}

func BenchmarkSetOneChangeOn1000(b *testing.B) {
	s := newScaleNode(b)
	peers := fakePeers(scalePeers)
	s.set(b, peers)
	round := 0
	for b.Loop() {
		round++
		s.set(b, moved(peers, round))
	}
}

func BenchmarkUpdateOneMovedOn1000(b *testing.B) {
	s := newScaleNode(b)
	peers := fakePeers(scalePeers)
	s.set(b, peers)
	round := 0
	for b.Loop() {
		round++
		s.update(b, moved(peers, round)[500])
	}
}

// update applies one moved peer through Update.
func (s *scaleNode) update(tb testing.TB, peer overlay.Node) time.Duration {
	tb.Helper()
	start := time.Now()
	rep, err := s.r.Update(context.Background(), s.self, overlay.PeerChange{Updated: []overlay.Node{peer}})
	if err != nil {
		tb.Fatal(err)
	}
	if len(rep.Applied) != 3 {
		tb.Fatalf("moving one peer applied %v, want its neighbour, new FDB entry and old FDB entry", rep.Applied)
	}
	return time.Since(start)
}

func BenchmarkIPBatch1000(b *testing.B) {
	s := newScaleNode(b)
	ipFile, bridgeFile := batchFiles(b, fakePeers(scalePeers))
	for b.Loop() {
		b.StopTimer()
		s.emptyDevice(b)
		b.StartTimer()
		s.ipBatch(b, ipFile, bridgeFile)
	}
}

// TestMeasureScale sets 1000 peers from nothing, applies one change on top
// through Set and one through Update,
// and writes the same objects with ip -batch; it logs the times (no timing
// assertions) and checks the results are the same objects.
func TestMeasureScale(t *testing.T) {
	s := newScaleNode(t)
	peers := fakePeers(scalePeers)
	full := s.set(t, peers)
	viaSet := readState(t, s.ns, "village.1")
	if len(viaSet.Routes) != scalePeers || len(viaSet.Neighs) != scalePeers || len(viaSet.FDB) != scalePeers {
		t.Fatalf("after Set: %d routes, %d neighbours, %d FDB entries; want %d each",
			len(viaSet.Routes), len(viaSet.Neighs), len(viaSet.FDB), scalePeers)
	}
	noop := s.set(t, peers)
	one := s.set(t, moved(peers, 1))
	// The same kind of move as a known change (Update), then Status: the
	// kernel is what Set would make.
	upd := s.update(t, moved(peers, 2)[500])
	if d, err := s.r.Status(context.Background(), s.self, moved(peers, 2)); err != nil || !d.Clean() {
		t.Errorf("after Update, Status: %v, %v", d, err)
	}
	ipFile, bridgeFile := batchFiles(t, peers)
	s.emptyDevice(t)
	batch := s.ipBatch(t, ipFile, bridgeFile)
	if viaBatch := readState(t, s.ns, "village.1"); fmt.Sprint(viaBatch) != fmt.Sprint(viaSet) {
		t.Errorf("ip -batch made different objects than Set")
	}
	t.Logf("%d peers from nothing: Set %v; ip -batch + bridge -batch %v", scalePeers, full, batch)
	t.Logf("on top of %d peers: no change %v, one peer moved %v", scalePeers, noop, one)
	t.Logf("on top of %d peers: one peer moved by Update %v", scalePeers, upd)
}

// BenchmarkUpdateOneAddedOn1000: one new peer on top of 1000 through Update
// (a new destination: the kernel is asked whether a foreign route is there),
// then removed again (untimed).
func BenchmarkUpdateOneAddedOn1000(b *testing.B) {
	s := newScaleNode(b)
	peers := fakePeers(scalePeers + 1)
	s.set(b, peers[:scalePeers])
	extra := peers[scalePeers]
	for b.Loop() {
		if _, err := s.r.Update(context.Background(), s.self, overlay.PeerChange{Added: []overlay.Node{extra}}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, err := s.r.Update(context.Background(), s.self, overlay.PeerChange{Removed: []overlay.Node{{Name: extra.Name}}}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkRepair5000: the periodic repair pass with nothing to repair,
// 5,000 VXLAN peers (15,000 objects): the dumps and the diff, no write.
func BenchmarkRepair5000(b *testing.B) {
	s := newScaleNode(b)
	peers := fakePeers(5000)
	s.set(b, peers)
	b.ReportAllocs()
	for b.Loop() {
		s.set(b, peers)
	}
}

// BenchmarkKernelRouteForms writes n peer routes into an empty VXLAN device
// with `ip -batch` (process start included), in two forms: "gateway", the
// form Set writes (via the peer's VTEP address, onlink), and "nexthop", one
// nexthop object per peer and a route naming it (nhid). It measures the
// kernel, not Village: IPv4 keeps one fib_info per distinct gateway in a
// hash keyed by device, protocol, metric and the like but not the
// gateway, so every route of one network's device lands in one chain and
// an insert walks all before it; a nexthop object's id is in that key.
// Figures in docs/performance.md ("The periodic pass at 5,000 peers").
func BenchmarkKernelRouteForms(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		for _, form := range []string{"gateway", "nexthop"} {
			b.Run(fmt.Sprintf("%s-%d", form, n), func(b *testing.B) {
				s := newScaleNode(b)
				var sb strings.Builder
				for i, p := range fakePeers(n) {
					c := p.PodCIDRs[0]
					if form == "gateway" {
						fmt.Fprintf(&sb, "route add %s via %s dev village.1 onlink proto 86 metric 100\n", c, c.IP)
						continue
					}
					fmt.Fprintf(&sb, "nexthop add id %d via %s dev village.1 onlink proto 86\n", 1000+i, c.IP)
					fmt.Fprintf(&sb, "route add %s nhid %d proto 86 metric 100\n", c, 1000+i)
				}
				file := filepath.Join(b.TempDir(), "routes.batch")
				if err := os.WriteFile(file, []byte(sb.String()), 0o600); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					b.StopTimer()
					s.emptyDevice(b)
					testenv.MustIP(b, s.ns, "nexthop", "flush")
					b.StartTimer()
					if out, err := exec.Command("ip", "-n", nsName(s.ns), "-batch", file).CombinedOutput(); err != nil {
						b.Fatalf("ip -batch: %v: %s", err, out)
					}
				}
			})
		}
	}
}
