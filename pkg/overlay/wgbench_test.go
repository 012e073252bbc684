package overlay_test

// BenchmarkWireGuardVsVXLAN: the wireguard backend (wireguard-go over TUN,
// the userspace device: this machine's kernel has no WireGuard module)
// against vxlan on the same two lab nodes, in one run, the two backends
// alternated round by round (wireguard first in even rounds, vxlan first in
// odd ones). Each node runs one reconciler per backend, each in a child
// process of its own (the test binary in the node's namespace, as
// TestWireGuardBackend does), so the CPU of a backend's process is its own:
// for wireguard that process is the WireGuard device (wireguard-go's
// encryption and decryption), for vxlan it is only the reconciler and the
// kernel does the encapsulation.
//
// Every round, for each backend: node1 is set up, then node2 joins (its
// Set, with node1 as peer); "join to first answer" is from the start of
// node2's Set to the first TCP answer from node1's pod to node2's pod
// (a connect and the server's first bytes: the handshake included). Then
// iperf3 pod to pod ($VILLAGE_WGBENCH_IPERF seconds, default 4), with the
// CPU of both nodes' backend processes, of the two iperf3 processes
// (rusage: their system time holds the kernel's TCP and, for vxlan, the
// encapsulation that runs in their context) and of the whole machine
// (/proc/stat: it holds every other process on the machine too); then
// TCP_RR (bench/cmd/tcprr, one connection, 1-byte request and answer, 3 s).
// Then both nodes tear the backend down.
//
// After the rounds: idle at 1,000 peers, persistentKeepalive 25 s (the
// agent's default), node2's vxlan process holding 1,000 peers in the same
// windows. First node1's wireguard process with 1,000 peers whose
// endpoints route out of its underlay to node2, which drops them (they
// never answer: wireguard-go retries each handshake every 5 s for 90 s),
// over $VILLAGE_WGBENCH_IDLE (default 40 s). Then 1,000 peers that answer
// (livePeers: wireguard-go devices in node2's namespace, in this process),
// over the 30 s after Set (the handshakes) and the next $VILLAGE_WGBENCH_IDLE
// (keepalives). CPU of each process per minute.
//
// Every FIGURE line ends with the load averages of /proc/loadavg (what
// uptime prints).

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/wireguard"
)

// wbLoad is the 1, 5 and 15-minute load averages.
func wbLoad() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// machineBusy is the CPU time of the whole machine that was not idle or
// waiting (all CPUs, /proc/stat).
func machineBusy(tb testing.TB) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// wbBackend is one backend's reconciler on each node.
type wbBackend struct {
	name  string
	cfg   [2]overlay.Config
	c     [2]*testenv.Child
	pid   [2]int
	wg    bool
	keys  [2]wgtypes.Key
	nodes [2]*labNode
}

func (be *wbBackend) do(tb testing.TB, i int, c wgCmd) wgAnswer {
	tb.Helper()
	c.Config = be.cfg[i]
	var a wgAnswer
	be.c[i].Do(c, &a)
	if a.Err != "" {
		tb.Fatalf("%s %s on %s: %s", be.name, c.Op, be.nodes[i].name, a.Err)
	}
	return a
}

func (be *wbBackend) self(i int) overlay.Node {
	n := be.nodes[i].node(false)
	n.WireGuardKey = be.keys[i]
	return n
}

// cpu is the CPU time of both nodes' processes of this backend.
func (be *wbBackend) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	var sum time.Duration
	for _, pid := range be.pid {
		p, err := testenv.ReadProcCPU(pid)
		if err != nil {
			tb.Fatal(err)
		}
		sum += p.Self
	}
	return sum
}

// nsPids is the processes in node n's namespace.
func nsPids(tb testing.TB, n *labNode) []int {
	tb.Helper()
	out, err := exec.Command("ip", "netns", "pids", nsName(n.ns)).Output()
	if err != nil {
		tb.Fatalf("ip netns pids %s: %v", nsName(n.ns), err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		p, _ := strconv.Atoi(f)
		pids = append(pids, p)
	}
	return pids
}

// startBackend starts the backend's child on each node and finds its pid:
// the one process of the node's namespace that was not there before.
func startBackend(tb testing.TB, name string, cfg overlay.Config, nodes [2]*labNode) *wbBackend {
	tb.Helper()
	be := &wbBackend{name: name, nodes: nodes, wg: cfg.Mode == overlay.ModeWireGuard}
	for i, n := range nodes {
		be.cfg[i] = cfg
		if be.wg {
			be.cfg[i].WireGuard.KeyFile = filepath.Join(tb.TempDir(), "wg.key")
		}
		before := nsPids(tb, n)
		be.c[i] = testenv.StartChild(tb, n.ns)
		if be.wg {
			k, err := wgtypes.ParseKey(be.do(tb, i, wgCmd{Op: "key"}).Key)
			if err != nil {
				tb.Fatal(err)
			}
			be.keys[i] = k
		} else {
			be.do(tb, i, wgCmd{Op: "podmtu", Self: n.node(false)})
		}
		for _, p := range nsPids(tb, n) {
			if !slices.Contains(before, p) {
				be.pid[i] = p
			}
		}
		if be.pid[i] == 0 {
			tb.Fatalf("%s child on %s: no new process in its namespace", name, n.name)
		}
	}
	return be
}

type wbSample struct {
	join, set   time.Duration
	gbps        float64
	gbit        float64
	backendCPU  time.Duration
	iperfCPU    time.Duration
	machineCPU  time.Duration
	rr          float64
	loadAtStart string
}

func BenchmarkWireGuardVsVXLAN(b *testing.B) {
	tcprr := testenv.BuildTCPRR(b)
	iperfSecs := envInt(b, "VILLAGE_WGBENCH_IPERF", 4)
	idle := time.Duration(envInt(b, "VILLAGE_WGBENCH_IDLE", 40)) * time.Second
	rounds := envInt(b, "VILLAGE_WGBENCH_ROUNDS", 3)

	segs := newSegments(b, 1)
	nodes := [2]*labNode{addNode(b, segs, 0, 1), addNode(b, segs, 0, 2)}
	port := 40000 + os.Getpid()%20000
	wgCfg := overlay.Config{Mode: overlay.ModeWireGuard, Underlay: "eth0", Network: "wgbench", Port: port,
		WireGuard: overlay.WireGuardConfig{PersistentKeepalive: 25 * time.Second, Userspace: wireguard.UserspaceAlways}}
	wg := startBackend(b, "wireguard", wgCfg, nodes)
	vx := startBackend(b, "vxlan", overlay.Config{Mode: overlay.ModeVXLAN, Underlay: "eth0", Network: "wgbench"}, nodes)
	n1, n2 := nodes[0], nodes[1]

	canary := "village-wgbench"
	testenv.ServeTCP(b, n1.pod, n1.pod4+":7777", canary)
	testenv.ServeTCPRR(b, n1.pod, tcprr, n1.pod4+":5300")
	ipSrv := exec.Command("ip", "netns", "exec", nsName(n1.pod), "iperf3", "-s", "-B", n1.pod4, "-p", "5201")
	if err := ipSrv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ipSrv.Process.Kill(); _ = ipSrv.Wait() })
	testenv.WaitFor(b, "iperf3 listening in node1's pod", func() error {
		if out := sh(b, n1.pod, "ss", "-Htln", "sport", "=", ":5201"); !strings.Contains(out, "5201") {
			return fmt.Errorf("not yet")
		}
		return nil
	})

	round := func(be *wbBackend) wbSample {
		s := wbSample{loadAtStart: wbLoad()}
		all := []overlay.Node{be.self(0), be.self(1)}
		a := be.do(b, 0, wgCmd{Op: "set", Self: all[0], Peers: all})
		for _, n := range nodes {
			n.setPodMTU(b, a.MTU)
		}
		start := time.Now()
		be.do(b, 1, wgCmd{Op: "set", Self: all[1], Peers: all})
		s.set = time.Since(start)
		c, err := testenv.DialerIn(n2.pod)(n1.pod4+":7777", 20*time.Second)
		if err != nil {
			b.Fatalf("%s: node2's pod to node1's pod after the join: %v", be.name, err)
		}
		got, err := io.ReadAll(c)
		s.join = time.Since(start)
		c.Close()
		if err != nil || string(got) != canary {
			b.Fatalf("%s: read %q (%v) from node1's pod, want %q", be.name, got, err, canary)
		}

		beCPU, mCPU, sCPU := be.cpu(b), machineBusy(b), procCPU(b, ipSrv.Process.Pid)
		cli := exec.Command("ip", "netns", "exec", nsName(n2.pod), "iperf3", "-c", n1.pod4, "-p", "5201", "-t", strconv.Itoa(iperfSecs), "-J")
		out, err := cli.Output()
		if err != nil {
			b.Fatalf("%s: iperf3 client: %v: %s", be.name, err, out)
		}
		s.backendCPU, s.machineCPU = be.cpu(b)-beCPU, machineBusy(b)-mCPU
		s.iperfCPU = rusageCPU(cli.ProcessState) + procCPU(b, ipSrv.Process.Pid) - sCPU
		var r struct {
			End struct {
				SumReceived struct {
					Bytes         float64 `json:"bytes"`
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.End.SumReceived.Bytes == 0 {
			b.Fatalf("%s: iperf3 -J: %v: %s", be.name, err, out)
		}
		s.gbps = r.End.SumReceived.BitsPerSecond / 1e9
		s.gbit = r.End.SumReceived.Bytes * 8 / 1e9

		s.rr = testenv.TCPRR(b, n2.pod, tcprr, n1.pod4+":5300", 3*time.Second)
		for i := range nodes {
			be.do(b, i, wgCmd{Op: "teardown"})
		}
		b.Logf("FIGURE %s round: join to first answer %v (its Set %v); %.2f Gbit/s; CPU over %.1f Gbit: %s process(es) %v, iperf3 %v, machine %v; TCP_RR %.0f/s; load %s at start, %s at end",
			be.name, s.join.Round(time.Millisecond), s.set.Round(time.Millisecond), s.gbps, s.gbit, be.name,
			s.backendCPU, s.iperfCPU, s.machineCPU, s.rr, s.loadAtStart, wbLoad())
		return s
	}

	for b.Loop() {
		b.Logf("FIGURE start: load %s", wbLoad())
		var ws, vs []wbSample
		for i := range rounds {
			if i%2 == 0 {
				ws = append(ws, round(wg))
				vs = append(vs, round(vx))
			} else {
				vs = append(vs, round(vx))
				ws = append(ws, round(wg))
			}
		}
		med := func(ss []wbSample, f func(wbSample) float64) float64 {
			v := make([]float64, len(ss))
			for i, s := range ss {
				v[i] = f(s)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		gbps := func(s wbSample) float64 { return s.gbps }
		rr := func(s wbSample) float64 { return s.rr }
		join := func(s wbSample) float64 { return s.join.Seconds() * 1000 }
		own := func(s wbSample) float64 { return (s.backendCPU + s.iperfCPU).Seconds() / s.gbit }
		mach := func(s wbSample) float64 { return s.machineCPU.Seconds() / s.gbit }
		for _, f := range []struct {
			what, unit string
			f          func(wbSample) float64
		}{
			{"TCP throughput (iperf3, pod to pod across nodes)", "Gbit/s", gbps},
			{"TCP_RR (1-byte request and answer)", "/s", rr},
			{"join to first answer", "ms", join},
			{"CPU per Gbit: backend processes + iperf3", "CPU s/Gbit", own},
			{"CPU per Gbit: whole machine (/proc/stat, other processes too)", "CPU s/Gbit", mach},
		} {
			w, v := med(ws, f.f), med(vs, f.f)
			b.Logf("FIGURE median of %d rounds, %s: wireguard %.3g %s, vxlan %.3g %s, wireguard/vxlan %.2f×; load %s",
				rounds, f.what, w, f.unit, v, f.unit, w/v, wbLoad())
		}

		// Idle at 1,000 peers, both backends in the same window.
		testenv.MustIP(b, n1.ns, "route", "replace", "10.60.0.0/16", "via", n2.ip4.String())
		testenv.MustIP(b, n2.ns, "route", "replace", "blackhole", "10.60.0.0/16")
		peers := fakePeers(scalePeers)
		for i := range peers {
			k, err := wgtypes.GeneratePrivateKey()
			if err != nil {
				b.Fatal(err)
			}
			peers[i].WireGuardKey = k.PublicKey()
		}
		vx.do(b, 1, wgCmd{Op: "set", Self: vx.self(1), Peers: peers})
		// window measures both processes over d and logs them.
		window := func(what string, d time.Duration) {
			w0, v0, l0 := procCPU(b, wg.pid[0]), procCPU(b, vx.pid[1]), wbLoad()
			time.Sleep(d) // the measured window itself, not a wait for a condition
			w1, v1 := procCPU(b, wg.pid[0]), procCPU(b, vx.pid[1])
			perMin := func(c time.Duration) time.Duration {
				return time.Duration(float64(c) * float64(time.Minute) / float64(d)).Round(time.Millisecond)
			}
			ratio := "n/a (vxlan used no measurable CPU)"
			if v1 > v0 {
				ratio = fmt.Sprintf("%.1f×", float64(w1-w0)/float64(v1-v0))
			}
			b.Logf("FIGURE idle at %d peers (keepalive 25 s), %s, over %v: wireguard process %v (%v per minute), vxlan process %v (%v per minute); wireguard/vxlan %s; load %s at start, %s at end",
				scalePeers, what, d, w1-w0, perMin(w1-w0), v1-v0, perMin(v1-v0), ratio, l0, wbLoad())
		}
		wg.do(b, 0, wgCmd{Op: "set", Self: wg.self(0), Peers: peers})
		window("peers that never answer, right after Set (handshake retries)", idle)
		wg.do(b, 0, wgCmd{Op: "teardown"})

		// The same with 1,000 peers that answer: wireguard-go devices in
		// node2's namespace (in this process, so not in node2's figure).
		live, devs := livePeers(b, n2, scalePeers, 21000, wg.keys[0], fmt.Sprintf("%s:%d", n1.ip4, port))
		wg.do(b, 0, wgCmd{Op: "set", Self: wg.self(0), Peers: live})
		window("peers that answer, the first 30 s after Set (1,000 handshakes)", 30*time.Second)
		window("peers that answer, the next window (keepalives only: no rekey before 2 min)", idle)
		got := withSession(b, devs)
		if got < scalePeers/2 {
			b.Fatalf("only %d of the %d answering peers have a session with node1", got, scalePeers)
		}
		b.Logf("FIGURE %d of the %d answering peers had a session with node1 at the end; load %s", got, scalePeers, wbLoad())
		wg.do(b, 0, wgCmd{Op: "teardown"})
		vx.do(b, 1, wgCmd{Op: "teardown"})
	}
}

func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	p, err := testenv.ReadProcCPU(pid)
	if err != nil {
		tb.Fatal(err)
	}
	return p.Self
}

func rusageCPU(ps *os.ProcessState) time.Duration {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive whole number", name, v)
	}
	return n
}

// nullTUN is a TUN device that has nothing to send and discards what it
// is given: a WireGuard peer that only keeps its session (keepalives and
// handshakes), with no interface of its own.
type nullTUN struct {
	events chan tun.Event
	closed chan struct{}
}

func newNullTUN() *nullTUN {
	t := &nullTUN{events: make(chan tun.Event, 1), closed: make(chan struct{})}
	t.events <- tun.EventUp
	return t
}

func (t *nullTUN) File() *os.File { return nil }
func (t *nullTUN) Read([][]byte, []int, int) (int, error) {
	<-t.closed
	return 0, os.ErrClosed
}
func (t *nullTUN) Write(bufs [][]byte, _ int) (int, error) { return len(bufs), nil }
func (t *nullTUN) MTU() (int, error)                       { return 1420, nil }
func (t *nullTUN) Name() (string, error)                   { return "null", nil }
func (t *nullTUN) Events() <-chan tun.Event                { return t.events }
func (t *nullTUN) BatchSize() int                          { return 1 }
func (t *nullTUN) Close() error {
	select {
	case <-t.closed:
	default:
		close(t.closed)
		close(t.events)
	}
	return nil
}

// udpBind is a conn.Bind over one IPv4 UDP socket that hands wireguard-go
// one packet per receive call: the standard bind keeps 128 64 KiB buffers
// per receive function (its batch), which for 1,000 devices would be
// gigabytes, and cannot be told a smaller batch.
type udpBind struct{ c *net.UDPConn }

type udpEndpoint struct{ netip.AddrPort }

func (udpEndpoint) ClearSrc()             {}
func (udpEndpoint) SrcToString() string   { return "" }
func (e udpEndpoint) DstToString() string { return e.String() }
func (e udpEndpoint) DstToBytes() []byte  { b, _ := e.MarshalBinary(); return b }
func (e udpEndpoint) DstIP() netip.Addr   { return e.Addr() }
func (udpEndpoint) SrcIP() netip.Addr     { return netip.Addr{} }

func (b *udpBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(port)})
	if err != nil {
		return nil, 0, err
	}
	b.c = c
	recv := func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		n, ap, err := c.ReadFromUDPAddrPort(packets[0])
		if err != nil {
			return 0, err
		}
		sizes[0], eps[0] = n, udpEndpoint{netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
		return 1, nil
	}
	return []conn.ReceiveFunc{recv}, uint16(c.LocalAddr().(*net.UDPAddr).Port), nil
}

func (b *udpBind) Close() error {
	if b.c == nil {
		return nil
	}
	err := b.c.Close()
	b.c = nil
	return err
}

func (*udpBind) SetMark(uint32) error { return nil }
func (*udpBind) BatchSize() int       { return 1 }

func (b *udpBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	e, ok := ep.(udpEndpoint)
	if !ok {
		return conn.ErrWrongEndpointType
	}
	for _, buf := range bufs {
		if _, err := b.c.WriteToUDPAddrPort(buf, e.AddrPort); err != nil {
			return err
		}
	}
	return nil
}

func (*udpBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	return udpEndpoint{ap}, err
}

// livePeers starts count wireguard-go devices in namespace n, each with its
// own key and port (from basePort), each with peer as its one peer
// (keepalive 25 s, as every Village node), and returns them as overlay
// peers: n's underlay address at their port. They run in this process
// (their sockets are opened in n) until the test ends.
func livePeers(tb testing.TB, n *labNode, count, basePort int, peer wgtypes.Key, peerEP string) ([]overlay.Node, []*device.Device) {
	tb.Helper()
	out := make([]overlay.Node, count)
	devs := make([]*device.Device, count)
	for i := range out {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			tb.Fatal(err)
		}
		dev := device.NewDevice(newNullTUN(), &udpBind{}, device.NewLogger(device.LogLevelSilent, ""))
		tb.Cleanup(dev.Close)
		devs[i] = dev
		port := basePort + i
		cfg := fmt.Sprintf("private_key=%x\nlisten_port=%d\npublic_key=%x\nendpoint=%s\npersistent_keepalive_interval=25\nallowed_ip=%s\n",
			k[:], port, peer[:], peerEP, "10.244.1.0/24")
		if err := testenv.InNS(n.ns, func() error {
			if err := dev.IpcSet(cfg); err != nil {
				return err
			}
			return dev.Up() // opens its sockets in n
		}); err != nil {
			tb.Fatalf("responder %d: %v", i, err)
		}
		out[i] = fakePeer(i)
		out[i].IP = n.ip4
		out[i].WireGuardKey = k.PublicKey()
		out[i].WireGuardEndpoint = &net.UDPAddr{IP: n.ip4, Port: port}
	}
	return out, devs
}

// withSession counts the devices that have completed a handshake with
// their peer.
func withSession(tb testing.TB, devs []*device.Device) int {
	tb.Helper()
	n := 0
	for _, d := range devs {
		st, err := d.IpcGet()
		if err != nil {
			tb.Fatal(err)
		}
		if !strings.Contains(st, "last_handshake_time_sec=0\n") {
			n++
		}
	}
	return n
}
