package drops

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
)

// model: a and b in ns (b isolated in ingress by ns/deny-b and ns/allow-c,
// local), c elsewhere.
func model(a, b, c string) *netpol.Model {
	ip := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	return &netpol.Model{Network: "t", Pods: []netpol.ModelPod{
		{Pod: "ns/a", IPs: ip(a), Local: true},
		{Pod: "ns/b", IPs: ip(b), Local: true, Ingress: &netpol.Isolation{Policies: []string{"ns/deny-b", "ns/allow-c"}}},
		{Pod: "ns/c", IPs: ip(c)},
	}}
}

func udp4(src, dst string, dport uint16) []byte {
	b := v4(17, 0, 0, 0x30, 0x39, byte(dport>>8), byte(dport))
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	return b
}

func TestRecorder(t *testing.T) {
	r := NewRecorder("t", 2)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, ok := r.Add("village:in:t", udp4("10.0.0.2", "10.0.0.3", 9), t0); !ok {
		t.Fatal("a sample before any model was refused")
	}
	r.SetModel(model("10.0.0.2", "10.0.0.3", "10.0.1.4"))
	for i := range 3 {
		if dir, ok := r.Add("village:in:t", udp4("10.0.0.2", "10.0.0.3", 9), t0.Add(time.Duration(i)*time.Second)); !ok || dir != "ingress" {
			t.Fatalf("sample %d: %s %v", i, dir, ok)
		}
	}
	for _, p := range []string{"village:in:other", "village:xx:t", "something else"} {
		if _, ok := r.Add(p, udp4("10.0.0.2", "10.0.0.3", 9), t0); ok {
			t.Errorf("prefix %q taken", p)
		}
	}
	if _, ok := r.Add("village:in:t", []byte{0x45}, t0); ok {
		t.Error("a cut packet taken")
	}
	f, changed := r.File(t0)
	if !changed || f.Samples != 4 || len(f.Drops) != 2 {
		t.Fatalf("file: changed %v, %+v", changed, f)
	}
	d := f.Drops[0]
	want := Drop{Direction: "ingress", Source: Endpoint{"ns/a", netip.MustParseAddr("10.0.0.2")}, Destination: Endpoint{"ns/b", netip.MustParseAddr("10.0.0.3")},
		Proto: "udp", Port: 9, Policies: []string{"ns/deny-b", "ns/allow-c"}, Count: 3, First: t0, Last: t0.Add(2 * time.Second)}
	if fmt.Sprint(d) != fmt.Sprint(want) {
		t.Errorf("latest drop %+v, want %+v", d, want)
	}
	if f.Drops[1].Source.Pod != "" || f.Drops[1].Count != 1 || f.Drops[1].Policies != nil {
		t.Errorf("the sample before the model: %+v", f.Drops[1])
	}
	if _, changed := r.File(t0); changed {
		t.Error("changed with no new sample")
	}
	// a later sample names the policies of its time
	m := model("10.0.0.2", "10.0.0.3", "10.0.1.4")
	m.Pods[1].Ingress.Policies = []string{"ns/deny-b"}
	r.SetModel(m)
	r.Add("village:in:t", udp4("10.0.0.2", "10.0.0.3", 9), t0.Add(2*time.Second))
	if f, _ := r.File(t0); !slices.Equal(f.Drops[0].Policies, []string{"ns/deny-b"}) || f.Drops[0].Count != 4 {
		t.Errorf("after the policies changed: %+v", f.Drops[0])
	}
	// a third key evicts the one seen longest ago
	r.Add("village:eg:t", udp4("10.0.0.3", "10.0.1.4", 53), t0.Add(3*time.Second))
	f, _ = r.File(t0)
	if len(f.Drops) != 2 || f.Drops[0].Destination.Pod != "ns/c" || f.Drops[0].Direction != "egress" || f.Drops[1].Count != 4 {
		t.Errorf("after a third: %+v", f.Drops)
	}
}

func TestTotals(t *testing.T) {
	names := NamesOf(model("10.0.0.2", "10.0.0.3", "10.0.1.4"))
	tot := NewTotals()
	in := Label{"ingress", "ns", "allow-c,deny-b"}
	cd := func(chain string, n uint64) table.ChainDrops {
		return table.ChainDrops{Chain: chain, Direction: "ingress", Key: chain[3:], Counts: table.Counts{Packets: n}}
	}
	steps := []struct {
		name  string
		drops []table.ChainDrops
		names *Names
		want  map[Label]uint64
	}{
		{"first read", []table.ChainDrops{cd("in.ns/b", 5)}, names, map[Label]uint64{in: 5}},
		{"grows", []table.ChainDrops{cd("in.ns/b", 7)}, names, map[Label]uint64{in: 7}},
		{"counter reset", []table.ChainDrops{cd("in.ns/b", 2)}, names, map[Label]uint64{in: 9}},
		// the drops since the last read go to the new label
		{"policies changed", []table.ChainDrops{cd("in.ns/b", 4)}, NamesOf(nil), map[Label]uint64{in: 9, {"ingress", "ns", ""}: 2}},
		{"counts under the new label", []table.ChainDrops{cd("in.ns/b", 6)}, NamesOf(nil), map[Label]uint64{in: 9, {"ingress", "ns", ""}: 4}},
		{"chain gone", nil, NamesOf(nil), map[Label]uint64{in: 9, {"ingress", "ns", ""}: 4}},
	}
	for _, s := range steps {
		got := tot.Observe(s.drops, s.names)
		if fmt.Sprint(got) != fmt.Sprint(s.want) {
			t.Errorf("%s: %v, want %v", s.name, got, s.want)
		}
	}
}

// TestRun: the samples of a real per-pod chain reach Run through NFLOG,
// named, and the file says so; the drop counter counts every packet.
func TestRun(t *testing.T) {
	l := testenv.NewPodLab(t)
	for i, name := range []string{"a", "b", "c"} {
		l.AddPod(name, i+2, true)
	}
	rs := &table.Ruleset{Network: "t", Bridge: "br0", Sets: map[string]table.Set{}, Pods: []table.PodRules{{Key: "ns/b",
		IPs: []netip.Addr{netip.MustParseAddr(l.V4["b"]), netip.MustParseAddr(l.V6["b"])}, Ingress: &table.Chain{}}}}
	if err := testenv.InNS(l.Node, func() error { return table.Apply(rs) }); err != nil {
		t.Fatal(err)
	}
	rec := NewRecorder("t", 0)
	rec.SetModel(model(l.V4["a"], l.V4["b"], l.V4["c"]))
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu      sync.Mutex
		sampled int
		runErr  = make(chan error, 1)
	)
	go func() {
		runErr <- Run(ctx, Config{Network: "t", RunDir: dir, Recorder: rec, NetNS: int(l.Node.Fd()),
			Sampled: func(string) { mu.Lock(); sampled++; mu.Unlock() }, Logf: t.Logf})
	}()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Error(err)
		}
	}()
	// Run listens once a sample sent now reaches it; keep sending one
	// datagram until then (each is counted below).
	sent := uint64(0)
	send := func(n int) {
		if err := testenv.SendUDP(l.Pods["a"], l.V4["b"], 9, n); err != nil {
			t.Fatal(err)
		}
		sent += uint64(n)
	}
	testenv.WaitFor(t, "a sample in the drops file", func() error {
		select {
		case err := <-runErr:
			t.Fatalf("Run: %v", err)
		default:
		}
		send(1)
		f, err := Read(dir, "t")
		if err != nil {
			t.Fatal(err)
		}
		if f == nil || len(f.Drops) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	send(25)
	testenv.WaitFor(t, "every packet counted", func() error {
		var all []table.ChainDrops
		if err := testenv.InNS(l.Node, func() (err error) { all, err = table.Drops("t"); return err }); err != nil {
			t.Fatal(err)
		}
		if len(all) != 1 || all[0].Packets != sent {
			return fmt.Errorf("counters %+v, sent %d", all, sent)
		}
		return nil
	})
	f, err := Read(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(Path(dir, "t")); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("the drops file is %v, not root-only (0600)", fi.Mode())
	}
	d := f.Drops[0]
	if len(f.Drops) != 1 || d.Source.Pod != "ns/a" || d.Destination.Pod != "ns/b" || d.Proto != "udp" || d.Port != 9 ||
		d.Direction != "ingress" || !slices.Equal(d.Policies, []string{"ns/deny-b", "ns/allow-c"}) || d.Count == 0 || d.Count > sent {
		t.Errorf("drops file: %+v (sent %d)", f, sent)
	}
	mu.Lock()
	defer mu.Unlock()
	if sampled == 0 || uint64(sampled) > sent {
		t.Errorf("%d samples of %d packets", sampled, sent)
	}
	t.Logf("%d datagrams dropped and counted, %d sampled; file: %d samples, latest drop count %d", sent, sampled, f.Samples, d.Count)
}
