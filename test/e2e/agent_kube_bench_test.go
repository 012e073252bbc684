package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/overlay"
)

// BenchmarkAgentKubeScale is the kubernetes registry at scale (run by
// scripts/bench.sh -only kube; not part of the test suite): one real
// villaged (vxlan) in a node namespace watching a real kube-apiserver while
// the benchmark creates 1,000 Node objects (no machines behind them: their
// underlay addresses are never contacted, vxlan routes are onlink). It
// reports the time from each Node's creation to its route on the watching
// node (median, p99), the agent's RSS and CPU while idle and while 100 Nodes
// change at once, and the API requests per minute the agent makes while
// nothing changes (from the API server's audit log).
func BenchmarkAgentKubeScale(b *testing.B) {
	const nodes, changed = 1000, 100
	lan := NewLAN(b)
	host := testenv.NewNS(b)
	lan.Attach(b, host, "eth0", agentEtcdIP+"/24")
	kube := kubetest.Start(b, kubetest.Options{NetNS: host, IP: agentEtcdIP, Audit: true})
	ctx := context.Background()
	nodesAPI := kube.Client.CoreV1().Nodes()
	// The agent as the DaemonSet runs it: bound by the shipped RBAC and
	// confined by its admission policies (it writes nothing until it is).
	applyRBAC(b, kube)
	self := NewNode(b)
	lan.Attach(b, self.NS, "lan0", agentLANPrefix+"11/24")
	_, err := nodesAPI.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "watcher"},
		Spec: corev1.NodeSpec{PodCIDR: "10.79.0.0/24", PodCIDRs: []string{"10.79.0.0/24"}}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	conf := filepath.Join(b.TempDir(), "agt.conflist")
	if err := os.WriteFile(conf, []byte(kubeConflist("vxlan", filepath.Join(self.Dir, "ipam"), kube.NodeAgentKubeconfig)), 0o644); err != nil {
		b.Fatal(err)
	}

	// Route additions seen in the node's namespace, by destination.
	seen := map[string]time.Time{}
	var mu sync.Mutex
	h, err := netns.GetFromPath(self.NS.Path())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	updates, done := make(chan netlink.RouteUpdate, 4096), make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{Namespace: &h, ReceiveBufferSize: 1 << 22}); err != nil {
		b.Fatal(err)
	}
	go func() {
		for u := range updates {
			if u.Type == syscall.RTM_NEWROUTE && u.Dst != nil {
				mu.Lock()
				if _, ok := seen[u.Dst.String()]; !ok {
					seen[u.Dst.String()] = time.Now()
				}
				mu.Unlock()
			}
		}
	}()

	pid, log := startWatcher(ctx, b, kube, self, conf)

	cidr := func(i int) string { return fmt.Sprintf("10.%d.%d.0/24", 80+i/256, i%256) }
	underlay := func(i, gen int) string { return fmt.Sprintf("172.%d.%d.%d", 20+gen, i/250, 1+i%250) }
	created := make([]time.Time, nodes)
	began := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				ip := underlay(i, 0)
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%04d", i), Annotations: map[string]string{
					kubenames.AnnotationUnderlayIP: ip, kubenames.AnnotationVtepMAC: overlay.DeriveMAC(net.ParseIP(ip)).String()}},
					Spec: corev1.NodeSpec{PodCIDR: cidr(i), PodCIDRs: []string{cidr(i)}}}
				created[i] = time.Now()
				if _, err := nodesAPI.Create(ctx, n, metav1.CreateOptions{}); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range nodes {
		work <- i
	}
	close(work)
	wg.Wait()
	createdIn := time.Since(began)
	waitUntil(b, 5*time.Minute, "routes to all 1,000 Nodes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= nodes
	}, log)
	var lat []time.Duration
	mu.Lock()
	for i := range nodes {
		lat = append(lat, seen[cidr(i)].Sub(created[i]))
	}
	mu.Unlock()
	slices.Sort(lat)
	med, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	b.Logf("FIGURE: %d Nodes created in %s (8 clients); Node creation -> route on the watching node: median %s, p99 %s, max %s",
		nodes, createdIn.Round(time.Millisecond), med.Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))

	// Idle: CPU and RSS over a minute, and the requests the agent made.
	time.Sleep(5 * time.Second)
	const idle = 60 * time.Second
	cpu0, t0 := cpuTime(b, pid), time.Now()
	time.Sleep(idle)
	cpuIdle := cpuTime(b, pid) - cpu0
	idleWindow := [2]time.Time{t0, time.Now()}
	rssIdle := rss(b, pid)
	events, err := kube.AuditEvents("kubetest-admin")
	if err != nil {
		b.Fatal(err)
	}
	var inWindow []string
	for _, e := range events {
		if strings.HasPrefix(e.UserAgent, "villaged") && e.Received.After(idleWindow[0]) && e.Received.Before(idleWindow[1]) {
			inWindow = append(inWindow, e.Verb+" "+e.RequestURI)
		}
	}
	b.Logf("FIGURE: idle with %d peers: agent RSS %.1f MiB, CPU %.2f%% of one core; API requests by the agent in %s idle: %d %v",
		nodes, float64(rssIdle)/(1<<20), 100*cpuIdle.Seconds()/idle.Seconds(), idle, len(inWindow), inWindow)

	// 100 Nodes change their underlay address at once.
	cpu0, t0 = cpuTime(b, pid), time.Now()
	work = make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				ip := underlay(i, 1)
				patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, kubenames.AnnotationUnderlayIP, ip,
					kubenames.AnnotationVtepMAC, overlay.DeriveMAC(net.ParseIP(ip)).String())
				if _, err := nodesAPI.Patch(ctx, fmt.Sprintf("n%04d", i), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range changed {
		work <- i
	}
	close(work)
	wg.Wait()
	peak := rss(b, pid)
	waitUntil(b, 2*time.Minute, "FDB entries follow the 100 changed Nodes", func() bool {
		fdb, _ := exec.Command("ip", "netns", "exec", filepath.Base(self.NS.Path()), "bridge", "fdb", "show", "dev", "village.9").CombinedOutput()
		if r := rss(b, pid); r > peak {
			peak = r
		}
		return strings.Count(string(fdb), "dst 172.21.") == changed
	}, log)
	busy := time.Since(t0)
	cpuBusy := cpuTime(b, pid) - cpu0
	b.Logf("FIGURE: %d Nodes changed at once: applied in %s; agent CPU %s (%.1f%% of one core over that time), peak RSS %.1f MiB",
		changed, busy.Round(time.Millisecond), cpuBusy.Round(time.Millisecond), 100*cpuBusy.Seconds()/busy.Seconds(), float64(peak)/(1<<20))
	b.ReportMetric(float64(med.Milliseconds()), "ms-median-create-to-route")
	b.ReportMetric(float64(p99.Milliseconds()), "ms-p99-create-to-route")
	b.ReportMetric(float64(len(inWindow))*time.Minute.Seconds()/idle.Seconds(), "idle-requests/min")
}

// startWatcher runs villaged as node "watcher" in self's namespace (its run
// directory under self.Dir), with the identity of the DaemonSet's pod on
// that node (kube.AgentOn: the conflist names kube.NodeAgentKubeconfig,
// and the caller applied the shipped RBAC and admission policies, without
// which the agent writes nothing), and returns once the agent has
// annotated its Node; the agent is stopped when the benchmark ends.
func startWatcher(ctx context.Context, b *testing.B, kube *kubetest.Server, self *Node, conf string) (int, *lockedBuffer) {
	nodes := kube.Client.CoreV1().Nodes()
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(self.NS.Path()), filepath.Join(testenv.Bins(b), "villaged"),
		"run", "--conf", conf, "--node-name", "watcher", "--run-dir", filepath.Join(self.Dir, "run"))
	cmd.Env = append(os.Environ(), kube.AgentOn(b, "watcher"))
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	waitUntil(b, 60*time.Second, "the agent annotates its Node", func() bool {
		n, err := nodes.Get(ctx, "watcher", metav1.GetOptions{})
		return err == nil && n.Annotations[kubenames.AnnotationUnderlayIP] != ""
	}, log)
	return cmd.Process.Pid, log
}

func waitUntil(b *testing.B, within time.Duration, what string, cond func() bool, log *lockedBuffer) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("%s: not within %s; agent log:\n%s", what, within, tailString(log.String(), 3000))
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// cpuTime is the user+system CPU time of pid.
func cpuTime(b *testing.B, pid int) time.Duration {
	c, err := testenv.ReadProcCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return c.Self
}

// cpuSettled is pid's CPU time once it stopped growing: the same reading
// (the kernel counts in 10 ms ticks) over 300 ms, or whatever it reads
// after 10 s of steady work.
func cpuSettled(b *testing.B, pid int) time.Duration {
	const quiet, bound = 300 * time.Millisecond, 10 * time.Second
	last, since := cpuTime(b, pid), time.Now()
	for end := time.Now().Add(bound); time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
		if c := cpuTime(b, pid); c != last {
			last, since = c, time.Now()
		} else if time.Since(since) >= quiet {
			break
		}
	}
	return last
}

// rss is the resident set size of pid in bytes.
func rss(b *testing.B, pid int) int64 { return procStatusKB(b, pid, "VmRSS") }

// procStatusKB is a size field of /proc/pid/status (VmRSS, RssAnon,
// RssFile) in bytes.
func procStatusKB(b *testing.B, pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, field+":") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkAgentKubeWatches counts the watch connections one agent holds
// on the API server (scripts/bench.sh -only kube; docs/performance.md,
// "Watches per node"): a real villaged with every Kubernetes controller on
// (the kubernetes registry, "networkPolicy": true, a LAN section with pods
// "annotated") in a node namespace, against a real kube-apiserver holding
// 50 simulated Nodes (Node objects with no machine behind them), a few
// namespaces and pods of its node and of others. Once the agent has a
// route to every Node and has compiled the policies, it reads the audit
// log: the agent's WATCH requests that are open. Every node of a cluster
// holds as many, so the API server holds this count times the nodes.
func BenchmarkAgentKubeWatches(b *testing.B) {
	const nodes = 50
	lan := NewLAN(b)
	host := testenv.NewNS(b)
	lan.Attach(b, host, "eth0", agentEtcdIP+"/24")
	kube := kubetest.Start(b, kubetest.Options{NetNS: host, IP: agentEtcdIP, Audit: true})
	ctx := context.Background()
	api := kube.Client
	applyRBAC(b, kube) // the agent as the DaemonSet runs it (see startWatcher)
	self := NewNode(b)
	lan.Attach(b, self.NS, "lan0", agentLANPrefix+"11/24")
	if _, err := api.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "watcher"},
		Spec: corev1.NodeSpec{PodCIDR: "10.79.0.0/24", PodCIDRs: []string{"10.79.0.0/24"}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	cidr := func(i int) string { return fmt.Sprintf("10.80.%d.0/24", i) }
	for i := range nodes {
		ip := fmt.Sprintf("172.20.0.%d", i+1)
		if _, err := api.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%02d", i), Annotations: map[string]string{
			kubenames.AnnotationUnderlayIP: ip, kubenames.AnnotationVtepMAC: overlay.DeriveMAC(net.ParseIP(ip)).String()}},
			Spec: corev1.NodeSpec{PodCIDR: cidr(i), PodCIDRs: []string{cidr(i)}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for n := range 3 {
		ns := fmt.Sprintf("ns%d", n)
		if _, err := api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if _, err := api.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for i, node := range []string{"watcher", "n00"} {
			if _, err := api.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	conf := filepath.Join(b.TempDir(), "agt.conflist")
	lanBlock := fmt.Sprintf(`"networkPolicy":true,"macvlan":{"master":"lan0","mode":"bridge","ifName":"net1","pods":"annotated",
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"192.168.77.0/24","rangeStart":"192.168.77.200","rangeEnd":"192.168.77.210"}]]}},`,
		filepath.Join(self.Dir, "lan"))
	text := strings.Replace(kubeConflist("vxlan", filepath.Join(self.Dir, "ipam"), kube.NodeAgentKubeconfig), `"ipMasq":true,`, `"ipMasq":true,`+lanBlock, 1)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	_, log := startWatcher(ctx, b, kube, self, conf)
	waitUntil(b, 2*time.Minute, "routes to the 50 Nodes and the policy compiled", func() bool {
		routes := 0
		for _, l := range strings.Split(testenv.MustIP(b, self.NS, "route", "show", "dev", "village.9"), "\n") {
			if strings.HasPrefix(l, "10.80.") {
				routes++
			}
		}
		st, err := controller.ReadStatus(filepath.Join(self.Dir, "run"), "agt")
		return routes == nodes && err == nil && st != nil && st.Compiled == 3
	}, log)
	// The agent's informers start their watches after their first list:
	// wait until the count holds still for 5 s.
	var open []string
	var since time.Time
	waitUntil(b, time.Minute, "the agent's watches settle", func() bool {
		now, err := kube.OpenWatches("villaged")
		if err != nil {
			b.Fatal(err)
		}
		if !slices.Equal(now, open) || since.IsZero() {
			open, since = now, time.Now()
		}
		return len(open) > 0 && time.Since(since) >= 5*time.Second
	}, log)
	// The TCP connections they share (client-go multiplexes a clientset's
	// requests over HTTP/2): the node namespace's connections to the API
	// server (only the agent runs there).
	ss, err := exec.Command("ip", "netns", "exec", filepath.Base(self.NS.Path()), "ss", "-Htn", "state", "established",
		"dst", agentEtcdIP+":6443").CombinedOutput()
	if err != nil {
		b.Fatalf("ss: %v: %s", err, ss)
	}
	conns := 0
	for _, l := range strings.Split(string(ss), "\n") {
		if strings.TrimSpace(l) != "" {
			conns++
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("FIGURE: %d simulated Nodes, registry + NetworkPolicy + LAN pods on: the agent holds %d watches on the API server over %d TCP connections (%d watches for %d such nodes): %v (load %s)",
		nodes, len(open), conns, len(open)*(nodes+1), nodes+1, open, strings.Join(strings.Fields(string(load))[:3], " "))
	b.ReportMetric(float64(len(open)), "watches/node")
	b.ReportMetric(float64(conns), "connections/node")
}
