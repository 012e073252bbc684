package drops

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// The drop logging benchmarks (scripts/bench.sh -only drops). Each
// prints FIGURE lines with the 1-minute load average: the machine may be
// shared, so the figures that matter are those measured side by side.

// benchNetwork is the network of the benchmarks' tables.
const benchNetwork = "dbench"

// dropLab is a test node (testenv.PodLab) with pods attacker and victim,
// victim isolated for ingress with no rule (ns/deny): the rules Compile
// makes, installed by table.Apply, the model written where `villaged
// drops` reads it, and the NFLOG listener (Run) started in a child
// process in the node's namespace.
type dropLab struct {
	*testenv.PodLab
	run, conf string
	pid       int // the listener's
}

func newDropLab(b *testing.B) *dropLab {
	l := &dropLab{PodLab: testenv.NewPodLab(b), run: b.TempDir()}
	l.AddPod("attacker", 2, true)
	l.AddPod("victim", 3, true)
	// the neighbours resolved before the policy: no datagram waits in a
	// neighbour queue, where the kernel may drop it before the policy
	if err := testenv.Dial(l.Pods["attacker"], l.V4["victim"], 80, testenv.DialBound); err != nil {
		b.Fatal(err)
	}
	in := netpol.Input{Network: benchNetwork, Bridge: "br0", Local: map[string]bool{}, Namespaces: map[string]map[string]string{"ns": {}}}
	for _, name := range []string{"attacker", "victim"} {
		p := &netpol.Pod{Namespace: "ns", Name: name, Labels: map[string]string{"app": name},
			IPs: []netip.Addr{netip.MustParseAddr(l.V4[name]), netip.MustParseAddr(l.V6[name])}}
		in.Pods = append(in.Pods, p)
		in.Local[p.Key()] = true
	}
	in.Policies = []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "victim"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}}
	if err := testenv.InNS(l.Node, func() error { return table.Apply(netpol.Compile(in)) }); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return table.Remove(benchNetwork) }) })
	m, err := json.Marshal(netpol.BuildModel(in))
	if err != nil {
		b.Fatal(err)
	}
	if err := nodelocal.WriteFile(nodelocal.PolicyModel(l.run, benchNetwork), m, 0o600); err != nil {
		b.Fatal(err)
	}
	l.conf = filepath.Join(b.TempDir(), "10-village.conflist")
	if err := os.WriteFile(l.conf, fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":"br0","networkPolicy":true,
		"ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.9.0.0/24"}]],"dataDir":%q}}]}`, benchNetwork, b.TempDir()), 0o644); err != nil {
		b.Fatal(err)
	}
	var a listenAnswer
	testenv.StartChild(b, l.Node).Do(listenCmd{RunDir: l.run, Network: benchNetwork}, &a)
	if a.Error != "" {
		b.Fatalf("the listener: %s", a.Error)
	}
	l.pid = a.Pid
	return l
}

// dropsView is what the benchmarks read of `villaged drops --json`.
type dropsView struct {
	// Victim is the exact count of ns/victim's ingress chain.
	Victim  uint64
	Samples uint64
	Drops   []Drop
}

// drops runs the built `villaged drops --json` in the node.
func (l *dropLab) drops(b *testing.B) dropsView {
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(l.Node.Path()), filepath.Join(testenv.Bins(b), "villaged"), "drops", "--json",
		"--conf", l.conf, "--node-name", "node", "--run-dir", l.run).CombinedOutput()
	if err != nil {
		b.Fatalf("villaged drops: %v: %s", err, out)
	}
	var f struct {
		Counts []struct {
			Pod, Direction string
			Packets        uint64
		} `json:"counts"`
		Samples uint64 `json:"samples"`
		Drops   []Drop `json:"drops"`
	}
	if err := json.Unmarshal(out, &f); err != nil {
		b.Fatalf("villaged drops --json: %v: %s", err, out)
	}
	v := dropsView{Samples: f.Samples, Drops: f.Drops}
	for _, c := range f.Counts {
		if c.Pod == "ns/victim" && c.Direction == "ingress" {
			v.Victim = c.Packets
		}
	}
	return v
}

func load() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Fields(string(b) + " ?")[0]
}

// BenchmarkDropLatency: a denied datagram (a new port each time) to the
// time its line is in `villaged drops --json`, polled back to back; 20
// drops, one at a time (within the sampling burst). The listener writes
// the drops file at most every WriteEvery.
func BenchmarkDropLatency(b *testing.B) {
	l := newDropLab(b)
	for b.Loop() {
		var lats, polls []time.Duration
		for i := range 20 {
			port := 20000 + i
			start := time.Now()
			if err := testenv.SendUDP(l.Pods["attacker"], l.V4["victim"], port, 1); err != nil {
				b.Fatal(err)
			}
			for seen := false; !seen; {
				if time.Since(start) > 30*time.Second {
					b.Fatalf("the drop to port %d is not in villaged drops after 30 s", port)
				}
				p := time.Now()
				for _, d := range l.drops(b).Drops {
					seen = seen || (d.Port == uint16(port) && d.Source.Pod == "ns/attacker")
				}
				polls = append(polls, time.Since(p))
			}
			lats = append(lats, time.Since(start))
		}
		slices.Sort(lats)
		slices.Sort(polls)
		b.Logf("FIGURE drop to villaged drops: p50 %v, p95 %v, max %v over %d drops (one villaged drops run: p50 %v); load %s",
			lats[len(lats)/2].Round(time.Millisecond), lats[len(lats)*95/100].Round(time.Millisecond), lats[len(lats)-1].Round(time.Millisecond),
			len(lats), polls[len(polls)/2].Round(time.Millisecond), load())
		b.ReportMetric(float64(lats[len(lats)/2].Milliseconds()), "p50-ms")
	}
}

// BenchmarkDropFlood: the attacker floods the victim with denied UDP
// (IPv4), one sender per CPU, for VILLAGE_FLOOD_SECONDS (10); the
// listener's CPU over the flood beside its CPU idle for as long before it,
// the rate reached, and the exact count checked against the datagrams
// sent.
func BenchmarkDropFlood(b *testing.B) {
	l := newDropLab(b)
	secs := testenv.EnvCount("VILLAGE_FLOOD_SECONDS", 10, 1)
	d := time.Duration(secs) * time.Second
	cpu := func() time.Duration {
		c, err := testenv.ReadProcCPU(l.pid)
		if err != nil {
			b.Fatal(err)
		}
		return c.Self
	}
	for b.Loop() {
		before := l.drops(b)
		c0 := cpu()
		time.Sleep(d) // the idle figure: the same length of time, no traffic
		idle := cpu() - c0
		senders := max(2, runtime.NumCPU())
		var wg sync.WaitGroup
		sent := make([]int, senders)
		errs := make([]error, senders)
		c1, start := cpu(), time.Now()
		for i := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = testenv.InNS(l.Pods["attacker"], func() error {
					c, err := net.Dial("udp", net.JoinHostPort(l.V4["victim"], "9999"))
					if err != nil {
						return err
					}
					defer c.Close()
					p := []byte("flood")
					for time.Since(start) < d {
						for range 256 {
							if _, err := c.Write(p); err != nil {
								return err
							}
							sent[i]++
						}
					}
					return nil
				})
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		total := 0
		for _, n := range sent {
			total += n
		}
		// the listener's CPU until it wrote the flood's last samples
		time.Sleep(2 * WriteEvery)
		busy := cpu() - c1
		after := l.drops(b)
		b0, b1 := before.Victim, after.Victim
		if b1-b0 != uint64(total) {
			b.Errorf("the victim's ingress counter grew by %d, %d datagrams sent", b1-b0, total)
		}
		b.Logf("FIGURE denied flood: %d datagrams in %v from %d senders (%.0f/s), all counted (%d); listener CPU %v over the flood (%.1f%% of one CPU) against %v idle over %v before; %d samples named (bound %d); load %s",
			total, elapsed.Round(time.Millisecond), senders, float64(total)/elapsed.Seconds(), b1-b0, busy.Round(time.Millisecond),
			100*busy.Seconds()/(elapsed+2*WriteEvery).Seconds(), idle.Round(time.Millisecond), d, after.Samples-before.Samples,
			table.SampleRate+int(float64(table.SampleRate)*elapsed.Seconds())+1, load())
		b.ReportMetric(float64(total)/elapsed.Seconds(), "pps")
	}
}

// BenchmarkDropLogging: allowed traffic with drop logging on (the tables
// as Apply writes them, on both nodes) and off (the same tables with the
// log rule of each per-pod chain deleted), alternated on off on off in one
// run, from pod client to a server pod a policy isolates and admits the
// client to: on the same node (pod local) and across nodes (pod server).
// Each step measures TCP_RR (bench/cmd/tcprr: one connection, 1-byte
// request and answer, 5 s) then TCP throughput (iperf3, one stream, 5 s).
// Node A is a PodLab (client, local); node B a namespace with its own
// bridge (server); the nodes are joined by a veth and route each other's
// pod subnet (host-gw's path). One FIGURE line per {same node, across
// nodes} × {TCP_RR, iperf3}, each with the load.
func BenchmarkDropLogging(b *testing.B) {
	tcprr := testenv.BuildTCPRR(b)
	// node A: the client's and local's (PodLab, 10.9.0.0/24); node B: the server's
	a := testenv.NewPodLab(b)
	a.AddPod("client", 2, true)
	a.AddPod("local", 3, true)
	nb := testenv.NewNS(b)
	srv := testenv.NewNS(b)
	testenv.MustIP(b, nb, "link", "add", "br0", "type", "bridge", "nf_call_iptables", "1", "nf_call_ip6tables", "1")
	testenv.MustIP(b, nb, "addr", "add", "10.9.1.1/24", "dev", "br0")
	testenv.MustIP(b, nb, "link", "set", "br0", "up")
	testenv.MustIP(b, nb, "link", "add", "veth-server", "type", "veth", "peer", "name", "eth0", "netns", srv.Path())
	testenv.MustIP(b, nb, "link", "set", "veth-server", "master", "br0", "up")
	testenv.MustIP(b, srv, "addr", "add", "10.9.1.2/24", "dev", "eth0")
	testenv.MustIP(b, srv, "link", "set", "eth0", "up")
	testenv.MustIP(b, srv, "route", "add", "default", "via", "10.9.1.1")
	testenv.MustIP(b, a.Node, "link", "add", "under", "type", "veth", "peer", "name", "under", "netns", nb.Path())
	testenv.MustIP(b, a.Node, "addr", "add", "192.168.99.1/24", "dev", "under")
	testenv.MustIP(b, nb, "addr", "add", "192.168.99.2/24", "dev", "under")
	testenv.MustIP(b, a.Node, "link", "set", "under", "up")
	testenv.MustIP(b, nb, "link", "set", "under", "up")
	testenv.MustIP(b, a.Node, "route", "add", "10.9.1.0/24", "via", "192.168.99.2")
	testenv.MustIP(b, nb, "route", "add", "10.9.0.0/24", "via", "192.168.99.1")
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(nb.Path()), "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		b.Fatalf("sysctl: %v: %s", err, out)
	}
	// local and server isolated for ingress, admitting client; each
	// node's tables hold the chains of its own pods
	in := netpol.Input{Network: benchNetwork, Bridge: "br0", Namespaces: map[string]map[string]string{"ns": {}},
		Pods: []*netpol.Pod{
			{Namespace: "ns", Name: "client", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{netip.MustParseAddr(a.V4["client"])}},
			{Namespace: "ns", Name: "local", Labels: map[string]string{"app": "server"}, IPs: []netip.Addr{netip.MustParseAddr(a.V4["local"])}},
			{Namespace: "ns", Name: "server", Labels: map[string]string{"app": "server"}, IPs: []netip.Addr{netip.MustParseAddr("10.9.1.2")}}},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "from-client"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}}}}},
	}
	inA, inB := in, in
	inA.Local = map[string]bool{"ns/client": true, "ns/local": true}
	inB.Local = map[string]bool{"ns/server": true}
	nodes := []struct {
		n  ns.NetNS
		rs *table.Ruleset
	}{{a.Node, netpol.Compile(inA)}, {nb, netpol.Compile(inB)}}
	logOn := func() {
		for _, node := range nodes {
			if err := testenv.InNS(node.n, func() error { return table.Apply(node.rs) }); err != nil {
				b.Fatal(err)
			}
			if logRules(b, node.n) == 0 {
				b.Fatalf("no log rule in node %s's tables with logging on", node.n.Path())
			}
		}
	}
	logOff := func() {
		for _, node := range nodes {
			deleteLogRules(b, node.n)
			if n := logRules(b, node.n); n != 0 {
				b.Fatalf("%d log rules left in node %s's tables with logging off", n, node.n.Path())
			}
		}
	}
	logOn()
	b.Cleanup(func() {
		for _, node := range nodes {
			_ = testenv.InNS(node.n, func() error { return table.Remove(benchNetwork) })
		}
	})

	const d = 5 * time.Second
	for _, c := range []struct {
		name, where, addr string
		server            ns.NetNS
	}{
		{"same-node", "on one node", a.V4["local"], a.Pods["local"]},
		{"across-nodes", "across nodes", "10.9.1.2", srv},
	} {
		b.Run(c.name, func(b *testing.B) {
			testenv.ServeTCPRR(b, c.server, tcprr, c.addr+":5300")
			testenv.ServeIperf3(b, c.server, c.addr)
			for b.Loop() {
				// [0]: TCP_RR /s, [1]: iperf3 Gbit/s; two steps each
				var on, off [2][]float64
				step := func(into *[2][]float64) {
					into[0] = append(into[0], testenv.TCPRR(b, a.Pods["client"], tcprr, c.addr+":5300", d))
					into[1] = append(into[1], testenv.Iperf3(b, a.Pods["client"], c.addr, d))
				}
				for range 2 {
					logOn()
					step(&on)
					logOff()
					step(&off)
				}
				logOn()
				mean := func(v []float64) float64 { return (v[0] + v[1]) / 2 }
				b.Logf("FIGURE TCP_RR %s to a pod a policy admits the client to: drop logging on %.0f, %.0f /s; off %.0f, %.0f /s; on/off %.3f×; load %s",
					c.where, on[0][0], on[0][1], off[0][0], off[0][1], mean(on[0])/mean(off[0]), load())
				b.Logf("FIGURE iperf3 %s to a pod a policy admits the client to: drop logging on %.2f, %.2f Gbit/s; off %.2f, %.2f Gbit/s; on/off %.3f×; load %s",
					c.where, on[1][0], on[1][1], off[1][0], off[1][1], mean(on[1])/mean(off[1]), load())
				b.ReportMetric(mean(on[0])/mean(off[0]), "rr-on/off")
				b.ReportMetric(mean(on[1])/mean(off[1]), "iperf3-on/off")
			}
		})
	}
}

var (
	nftTable  = regexp.MustCompile(`^table (\S+) (\S+) \{`)
	nftChain  = regexp.MustCompile(`^\s*chain (\S+) \{`)
	nftHandle = regexp.MustCompile(`# handle (\d+)$`)
)

// logSites are the family, table, chain and handle of each drop log
// rule in n.
func logSites(b *testing.B, n interface{ Path() string }) [][4]string {
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "nft", "-a", "list", "ruleset").CombinedOutput()
	if err != nil {
		b.Fatalf("nft list ruleset: %v: %s", err, out)
	}
	var fam, tbl, chain string
	var sites [][4]string
	for _, line := range strings.Split(string(out), "\n") {
		if m := nftTable.FindStringSubmatch(line); m != nil {
			fam, tbl = m[1], m[2]
		}
		if m := nftChain.FindStringSubmatch(line); m != nil {
			chain = m[1]
		}
		if strings.Contains(line, `log prefix "village:`) {
			if m := nftHandle.FindStringSubmatch(line); m != nil {
				sites = append(sites, [4]string{fam, tbl, chain, m[1]})
			}
		}
	}
	return sites
}

func logRules(b *testing.B, n interface{ Path() string }) int { return len(logSites(b, n)) }

// deleteLogRules deletes every drop log rule of n's tables: drop logging
// off, the rest of each chain as it was.
func deleteLogRules(b *testing.B, n interface{ Path() string }) {
	for _, s := range logSites(b, n) {
		if out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "nft", "delete", "rule", s[0], s[1], s[2], "handle", s[3]).CombinedOutput(); err != nil {
			b.Fatalf("nft delete rule %v: %v: %s", s, err, out)
		}
	}
}
