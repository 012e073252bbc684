package e2e

import (
	"context"
	"encoding/json"
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
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/overlay"
)

// BenchmarkControlPlaneVsFlannel is the control plane at scale against
// flanneld (run by scripts/bench.sh -only flannel; not part of the test
// suite): villaged and flanneld (--kube-subnet-mgr, $VILLAGE_FLANNELD, built
// by scripts/flannel.sh) each run in a node namespace of their own, watching
// one real kube-apiserver, with the same backend (a vxlan round, then a
// host-gw round). In each round the benchmark creates N Node objects
// ($VILLAGE_BENCH_NODES, default 1000; a comma list runs each size) carrying
// spec.podCIDRs and both projects' annotations (no machines behind them:
// their underlay addresses lie on the watchers' LAN subnet but nothing is
// sent to them), changes 100 Nodes' underlay address at once, deletes 100,
// idles (cpIdle), and then deletes objects by hand in each namespace and
// times their return (controlplane_repair_bench_test.go: one at a time,
// 1,000 routes at once, the masquerade table ten times a second). Per event it takes the time from the API write (the moment
// the request was sent) to the kernel objects in each watcher's namespace
// (netlink notifications: the route, and for vxlan the neighbour and FDB
// entries; the event's time is the last of them), and reports p50, p99 and
// max, both from the request and from the moment a plain watch of this
// process got the event (watchNodes: the floor the API server sets for
// both agents alike); each agent's CPU and RSS (anonymous and file-backed
// apart); and the API requests each made while idle and in each churn
// phase (the API server's audit log, by user agent).
func BenchmarkControlPlaneVsFlannel(b *testing.B) {
	flanneld := os.Getenv("VILLAGE_FLANNELD")
	if flanneld == "" {
		b.Fatal("VILLAGE_FLANNELD is not set: run scripts/bench.sh -only flannel (it builds flanneld with scripts/flannel.sh)")
	}
	sizes := []int{1000}
	if s := os.Getenv("VILLAGE_BENCH_NODES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 200 || n > 5000 {
				b.Fatalf("VILLAGE_BENCH_NODES: %q (want 200..5000)", f)
			}
			sizes = append(sizes, n)
		}
	}
	cpEnvDuration(b, "VILLAGE_BENCH_IDLE", &cpIdle)
	if s := os.Getenv("VILLAGE_BENCH_REPAIRS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			b.Fatalf("VILLAGE_BENCH_REPAIRS: %q (want 1..100)", s)
		}
		cpRepairs = n
	}
	cpEnvDuration(b, "VILLAGE_BENCH_NEVER", &cpNever)
	cpEnvDuration(b, "VILLAGE_BENCH_STORM", &cpStorm)
	for _, n := range sizes {
		for _, mode := range []string{"vxlan", "host-gw"} {
			b.Run(fmt.Sprintf("%s-%d", mode, n), func(b *testing.B) { controlPlaneRound(b, flanneld, mode, n) })
		}
	}
}

// cpIdle is the idle phase (VILLAGE_BENCH_IDLE): 6.5 minutes, to hold one
// of villaged's safety-net passes (every 5 minutes jittered 0.8-1.2 by
// default; the benchmark reports the passes its log shows in the window).
var cpIdle = 6*time.Minute + 30*time.Second

const (
	cpChanged = 100
	// cpLAN is the watchers' second address: the Nodes' underlay addresses
	// (172.20.x.y, changed to 172.21.x.y) are on its subnet, as host-gw needs.
	cpLANNet = "/15"
)

// cpWatcher is one agent in its node namespace and what its kernel did.
type cpWatcher struct {
	name  string // villaged, flanneld
	node  string // its Node
	ns    *Node
	cmd   *exec.Cmd
	log   string // log file
	agent string // user agent prefix in the audit log
	mu    sync.Mutex
	seen  map[string]time.Time // first RTM_NEW/RTM_DEL per object key
	last  map[string]time.Time // the latest, for the repair phases
	bump  chan struct{}        // closed (and made anew) at each mark
}

func (w *cpWatcher) mark(key string, at time.Time) {
	w.mu.Lock()
	if _, ok := w.seen[key]; !ok {
		w.seen[key] = at
	}
	if w.last == nil {
		w.last = map[string]time.Time{}
	}
	w.last[key] = at
	if w.bump != nil {
		close(w.bump)
	}
	w.bump = make(chan struct{})
	w.mu.Unlock()
}

// after waits until key has a notification later than t0 and returns its
// time; false when none came within (or by deadline, whichever is first).
func (w *cpWatcher) after(key string, t0 time.Time, deadline time.Time) (time.Time, bool) {
	for {
		w.mu.Lock()
		t, ok := w.last[key]
		if w.bump == nil {
			w.bump = make(chan struct{})
		}
		bump := w.bump
		w.mu.Unlock()
		if ok && t.After(t0) {
			return t, true
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return time.Time{}, false
		}
		select {
		case <-bump:
		case <-time.After(wait):
		}
	}
}

func (w *cpWatcher) at(key string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.seen[key]
	return t, ok
}

// watch records route and neighbour/FDB notifications of the namespace.
func (w *cpWatcher) watch(b *testing.B, done chan struct{}) {
	h, err := netns.GetFromPath(w.ns.NS.Path())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	onErr := func(what string) func(error) {
		return func(err error) {
			select {
			case <-done: // the subscription ends with the benchmark
			default:
				b.Errorf("%s %s notifications: %v", w.name, what, err)
			}
		}
	}
	routes := make(chan netlink.RouteUpdate, 1<<14)
	neighs := make(chan netlink.NeighUpdate, 1<<14)
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &h, ReceiveBufferSize: 1 << 24,
		ErrorCallback: onErr("route")}); err != nil {
		b.Fatal(err)
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{Namespace: &h, ReceiveBufferSize: 1 << 24,
		ErrorCallback: onErr("neighbour")}); err != nil {
		b.Fatal(err)
	}
	w.watchRepairs(b, h, done, onErr)
	go func() {
		for u := range routes {
			now := time.Now()
			if u.Dst == nil {
				continue
			}
			switch u.Type {
			case unix.RTM_NEWROUTE:
				w.mark("R "+u.Dst.String()+" "+u.Gw.String(), now)
			case unix.RTM_DELROUTE:
				w.mark("D "+u.Dst.String(), now)
			}
		}
	}()
	go func() {
		for u := range neighs {
			now := time.Now()
			if u.Type != unix.RTM_NEWNEIGH || u.IP == nil {
				continue
			}
			if u.Family == unix.AF_BRIDGE {
				w.mark("F "+u.HardwareAddr.String()+" "+u.IP.String(), now)
			} else {
				w.mark("N "+u.IP.String()+" "+u.HardwareAddr.String(), now)
			}
		}
	}()
}

func cpCIDR(i int) string { return fmt.Sprintf("10.%d.%d.0/24", 80+i/256, i%256) }
func cpIP(i, gen int) string {
	return fmt.Sprintf("172.%d.%d.%d", 20+gen, i/250, 1+i%250)
}

// cpKeys are the kernel objects node i needs on a watcher, in the
// notification keys of watch.
func cpKeys(mode string, i, gen int) []string {
	ip := cpIP(i, gen)
	mac := overlay.DeriveMAC(net.ParseIP(ip)).String()
	vtep := strings.TrimSuffix(cpCIDR(i), "/24")
	if mode == "host-gw" {
		return []string{"R " + cpCIDR(i) + " " + ip}
	}
	if gen > 0 { // a move: the route stays, the neighbour and FDB entries follow
		return []string{"N " + vtep + " " + mac, "F " + mac + " " + ip}
	}
	return []string{"R " + cpCIDR(i) + " " + vtep, "N " + vtep + " " + mac, "F " + mac + " " + ip}
}

func cpNode(mode string, i, gen int) *corev1.Node {
	ip := cpIP(i, gen)
	mac := overlay.DeriveMAC(net.ParseIP(ip)).String()
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%04d", i), Annotations: cpAnnotations(mode, ip, mac)},
		Spec: corev1.NodeSpec{PodCIDR: cpCIDR(i), PodCIDRs: []string{cpCIDR(i)}}}
}

func cpAnnotations(mode, ip, mac string) map[string]string {
	data := "null"
	if mode == "vxlan" {
		data = fmt.Sprintf(`{"VNI":9,"VtepMAC":%q}`, mac)
	}
	return map[string]string{
		kubenames.AnnotationUnderlayIP: ip, kubenames.AnnotationVtepMAC: mac,
		"flannel.alpha.coreos.com/public-ip": ip, "flannel.alpha.coreos.com/backend-type": mode,
		"flannel.alpha.coreos.com/backend-data": data, "flannel.alpha.coreos.com/kube-subnet-manager": "true",
	}
}

// cpTimes waits until every watcher has the objects of nodes (by index)
// and returns, per watcher, the time of the last of each node's objects, in
// the order of nodes.
func cpTimes(b *testing.B, ws []*cpWatcher, nodes []int, keys func(i int) []string, within time.Duration) map[string][]time.Time {
	out := map[string][]time.Time{}
	for _, w := range ws {
		deadline := time.Now().Add(within)
		var ts []time.Time
		for {
			ts = ts[:0]
			missing := ""
			for _, i := range nodes {
				var last time.Time
				for _, k := range keys(i) {
					t, ok := w.at(k)
					if !ok {
						missing = k
						break
					}
					if t.After(last) {
						last = t
					}
				}
				if missing != "" {
					break
				}
				ts = append(ts, last)
			}
			if missing == "" {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: no %s within %s; log tail:\n%s", w.name, missing, within, tailFile(w.log, 3000))
			}
			time.Sleep(100 * time.Millisecond)
		}
		out[w.name] = slices.Clone(ts)
	}
	return out
}

// since is each ts[k] less from(k), sorted.
func since(ts []time.Time, from func(k int) time.Time) []time.Duration {
	d := make([]time.Duration, len(ts))
	for k, t := range ts {
		d[k] = t.Sub(from(k))
	}
	slices.Sort(d)
	return d
}

// watchNodes is the floor both agents share: a plain watch of the Nodes
// from this process, which marks when the API server delivered each
// benchmark Node's creation ("A name"), its move to the second address
// ("M name") and its deletion ("X name"). An agent's time after this
// delivery is its own work (its watch, decoding, the kernel writes).
func watchNodes(b *testing.B, ctx context.Context, kube *kubetest.Server, w *cpWatcher) {
	cfg := rest.CopyConfig(kube.Config)
	cfg.Timeout = 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	nodes := cs.CoreV1().Nodes()
	l, err := nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(ctx, o) },
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rw.Stop)
	go func() {
		for ev := range rw.ResultChan() {
			now := time.Now()
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Added:
				w.mark("A "+n.Name, now)
			case ev.Type == watch.Deleted:
				w.mark("X "+n.Name, now)
			case ev.Type == watch.Modified && strings.HasPrefix(n.Annotations[kubenames.AnnotationUnderlayIP], "172.21."):
				w.mark("M "+n.Name, now)
			}
		}
	}()
}

func tailFile(path string, n int) string {
	raw, _ := os.ReadFile(path)
	return tailString(string(raw), n)
}

// pct is the p-th percentile of the sorted lat, to the millisecond.
func pct(lat []time.Duration, p int) time.Duration { return pctTo(lat, p, time.Millisecond) }

// pctTo is pct rounded to r.
func pctTo(lat []time.Duration, p int, r time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	i := len(lat) * p / 100
	if i >= len(lat) {
		i = len(lat) - 1
	}
	return lat[i].Round(r)
}

// cpEnvDuration sets *d from the environment variable name when it is set
// (a duration of 1 s or more).
func cpEnvDuration(b *testing.B, name string, d *time.Duration) {
	s := os.Getenv(name)
	if s == "" {
		return
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < time.Second {
		b.Fatalf("%s: %q (want a duration of 1s or more)", name, s)
	}
	*d = v
}

// cpParallel runs f over items with 8 clients.
func cpParallel(items []int, f func(i int)) {
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				f(i)
			}
		})
	}
	for _, i := range items {
		work <- i
	}
	close(work)
	wg.Wait()
}

func loadAvg() string {
	raw, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func controlPlaneRound(b *testing.B, flanneld, mode string, nodes int) {
	lan := NewLAN(b)
	host := testenv.NewNS(b)
	lan.Attach(b, host, "eth0", agentEtcdIP+"/24")
	kube := kubetest.Start(b, kubetest.Options{NetNS: host, IP: agentEtcdIP, Audit: true})
	// villaged as the DaemonSet runs it: bound by the shipped RBAC and
	// confined by its admission policies (it writes nothing until it is).
	applyRBAC(b, kube)
	ctx := context.Background()
	api := kube.Client.CoreV1().Nodes()
	done := make(chan struct{})
	b.Cleanup(func() { close(done) })

	ws := []*cpWatcher{
		{name: "villaged", node: "watcher-v", agent: "villaged", seen: map[string]time.Time{}},
		{name: "flanneld", node: "watcher-f", agent: "flanneld", seen: map[string]time.Time{}},
	}
	for k, w := range ws {
		w.ns = NewNode(b)
		lan.Attach(b, w.ns.NS, "lan0", fmt.Sprintf("%s%d/24", agentLANPrefix, 11+k))
		testenv.MustIP(b, w.ns.NS, "addr", "add", fmt.Sprintf("172.21.255.%d%s", 250+k, cpLANNet), "dev", "lan0")
		cidr := fmt.Sprintf("10.120.%d.0/24", k)
		// (flanneld panics on a Node without any annotation.)
		if _, err := api.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.node, Annotations: map[string]string{"bench.village.test/role": "watcher"}},
			Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		w.watch(b, done)
		w.log = filepath.Join(w.ns.Dir, w.name+".log")
		logf, err := os.Create(w.log)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { logf.Close() })
		var argv []string
		switch w.name {
		case "villaged":
			conf := filepath.Join(w.ns.Dir, "agt.conflist")
			if err := os.WriteFile(conf, []byte(kubeConflist(mode, filepath.Join(w.ns.Dir, "ipam"), kube.NodeAgentKubeconfig)), 0o644); err != nil {
				b.Fatal(err)
			}
			argv = []string{filepath.Join(testenv.Bins(b), "villaged"), "run", "--conf", conf, "--node-name", w.node,
				"--run-dir", filepath.Join(w.ns.Dir, "run")}
		default:
			netConf := filepath.Join(w.ns.Dir, "net-conf.json")
			nc, _ := json.Marshal(map[string]any{"Network": "10.64.0.0/10", "Backend": map[string]any{"Type": mode, "VNI": 9}})
			if err := os.WriteFile(netConf, nc, 0o644); err != nil {
				b.Fatal(err)
			}
			argv = []string{flanneld, "--kube-subnet-mgr", "--kubeconfig-file", kube.AdminKubeconfig, "--iface", "lan0",
				"--ip-masq=false", "--net-config-path", netConf, "--subnet-file", filepath.Join(w.ns.Dir, "subnet.env")}
		}
		w.cmd = exec.Command("ip", append([]string{"netns", "exec", w.ns.Name()}, argv...)...)
		w.cmd.Env = append(os.Environ(), "NODE_NAME="+w.node)
		if w.name == "villaged" {
			w.cmd.Env = append(w.cmd.Env, kube.AgentOn(b, w.node))
		}
		w.cmd.Stdout, w.cmd.Stderr = logf, logf
		if err := w.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = w.cmd.Process.Signal(syscall.SIGTERM); _ = w.cmd.Wait() })
	}
	// Both have annotated their Nodes: they are up and watching.
	for _, w := range ws {
		key := kubenames.AnnotationUnderlayIP
		if w.name == "flanneld" {
			key = "flannel.alpha.coreos.com/public-ip"
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			n, err := api.Get(ctx, w.node, metav1.GetOptions{})
			if err == nil && n.Annotations[key] != "" {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s did not annotate its Node; log tail:\n%s", w.name, tailFile(w.log, 3000))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	sent := make([]time.Time, nodes) // per Node, when its request was sent
	floor := &cpWatcher{name: "watch", seen: map[string]time.Time{}}
	watchNodes(b, ctx, kube, floor)
	// figure waits for the kernel objects of idx on both watchers and the
	// floor's delivery (floorKey), and reports, per agent, the time from
	// the API request to the kernel and from the floor's delivery to the
	// kernel (the agent's own part).
	figure := func(phase string, idx []int, keys func(i int) []string, floorKey string, within time.Duration) {
		ts := cpTimes(b, ws, idx, keys, within)
		fl := cpTimes(b, []*cpWatcher{floor}, idx, func(i int) []string { return []string{fmt.Sprintf("%s n%04d", floorKey, i)} }, within)["watch"]
		sentOf := func(k int) time.Time { return sent[idx[k]] }
		l := since(fl, sentOf)
		b.Logf("FIGURE: %s %d nodes, %s: watch delivery p50 %s p99 %s max %s (n=%d)", mode, nodes, phase, pct(l, 50), pct(l, 99), pct(l, 100), len(l))
		e2e, own := map[string]time.Duration{}, map[string]time.Duration{}
		for _, w := range ws {
			l := since(ts[w.name], sentOf)
			o := since(ts[w.name], func(k int) time.Time { return fl[k] })
			e2e[w.name], own[w.name] = pct(l, 99), pct(o, 99)
			b.Logf("FIGURE: %s %d nodes, %s: %s p50 %s p99 %s max %s (n=%d); after the watch delivery p50 %s p99 %s max %s",
				mode, nodes, phase, w.name, pct(l, 50), pct(l, 99), pct(l, 100), len(l), pct(o, 50), pct(o, 99), pct(o, 100))
		}
		if f := e2e["flanneld"]; f > 0 {
			b.Logf("FIGURE: %s %d nodes, %s: p99 villaged/flanneld %.2f", mode, nodes, phase, float64(e2e["villaged"])/float64(f))
		}
		if f := own["flanneld"]; f > 0 {
			b.Logf("FIGURE: %s %d nodes, %s: p99 after the watch delivery villaged/flanneld %.2f", mode, nodes, phase, float64(own["villaged"])/float64(f))
		}
	}
	cpu := func() map[string]time.Duration {
		m := map[string]time.Duration{}
		for _, w := range ws {
			m[w.name] = cpuTime(b, w.cmd.Process.Pid)
		}
		return m
	}
	resources := func(phase string, cpu0 map[string]time.Duration, t0 time.Time) {
		el := time.Since(t0)
		for _, w := range ws {
			c := cpuTime(b, w.cmd.Process.Pid) - cpu0[w.name]
			pid := w.cmd.Process.Pid
			mib := func(field string) float64 { return float64(procStatusKB(b, pid, field)) / (1 << 20) }
			b.Logf("FIGURE: %s %d nodes, %s: %s CPU %s (%.1f%% of one core over %s), RSS %.1f MiB (anonymous %.1f, file %.1f)",
				mode, nodes, phase, w.name, c.Round(time.Millisecond), 100*c.Seconds()/el.Seconds(), el.Round(time.Millisecond),
				mib("VmRSS"), mib("RssAnon"), mib("RssFile"))
		}
	}
	requests := func(phase string, from, to time.Time) {
		events, err := kube.AuditEvents("")
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range ws {
			verbs := map[string]int{}
			total := 0
			for _, e := range events {
				if strings.HasPrefix(e.UserAgent, w.agent) && !e.Received.Before(from) && e.Received.Before(to) {
					verbs[e.Verb]++
					total++
				}
			}
			b.Logf("FIGURE: %s %d nodes, %s: %s API requests %d %v", mode, nodes, phase, w.name, total, verbs)
		}
	}
	b.Logf("FIGURE: %s %d nodes: load average at start %s", mode, nodes, loadAvg())

	all := make([]int, nodes)
	for i := range all {
		all[i] = i
	}
	cpu0, t0 := cpu(), time.Now()
	cpParallel(all, func(i int) {
		sent[i] = time.Now()
		if _, err := api.Create(ctx, cpNode(mode, i, 0), metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	})
	b.Logf("FIGURE: %s %d nodes created in %s (8 clients)", mode, nodes, time.Since(t0).Round(time.Millisecond))
	figure("create -> kernel", all, func(i int) []string { return cpKeys(mode, i, 0) }, "A", 10*time.Minute)
	resources("create", cpu0, t0)
	requests("create", t0, time.Now())

	// 100 Nodes change their underlay address at once.
	changed := all[:cpChanged]
	cpu0, t0 = cpu(), time.Now()
	cpParallel(changed, func(i int) {
		ip := cpIP(i, 1)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": cpAnnotations(mode, ip, overlay.DeriveMAC(net.ParseIP(ip)).String())}})
		sent[i] = time.Now()
		if _, err := api.Patch(ctx, fmt.Sprintf("n%04d", i), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			b.Error(err)
		}
	})
	figure("change 100 -> kernel", changed, func(i int) []string { return cpKeys(mode, i, 1) }, "M", 5*time.Minute)
	resources("change", cpu0, t0)
	requests("change", t0, time.Now())

	// 100 other Nodes are deleted at once.
	deleted := all[nodes-cpChanged:]
	cpu0, t0 = cpu(), time.Now()
	cpParallel(deleted, func(i int) {
		sent[i] = time.Now()
		if err := api.Delete(ctx, fmt.Sprintf("n%04d", i), metav1.DeleteOptions{}); err != nil {
			b.Error(err)
		}
	})
	figure("delete 100 -> route gone", deleted, func(i int) []string { return []string{"D " + cpCIDR(i)} }, "X", 5*time.Minute)
	resources("delete", cpu0, t0)
	requests("delete", t0, time.Now())

	// Idle: only the watch, and villaged's safety net (found in its log).
	logAt := fileSize(ws[0].log)
	b.Logf("FIGURE: %s %d nodes: load average before idle %s", mode, nodes, loadAvg())
	cpu0, t0 = cpu(), time.Now()
	time.Sleep(cpIdle)
	resources("idle", cpu0, t0)
	el := time.Since(t0)
	for _, w := range ws {
		c := cpuTime(b, w.cmd.Process.Pid) - cpu0[w.name]
		b.Logf("FIGURE: %s %d nodes, idle: %s CPU %.1f ms per minute over %s", mode, nodes, w.name, float64(c.Microseconds())/1000/el.Minutes(), el.Round(time.Second))
	}
	nets, lines := cpSafetyNets(ws[0].log, logAt)
	b.Logf("FIGURE: %s %d nodes, idle: villaged safety-net passes in the window: %d %q", mode, nodes, nets, lines)
	requests("idle", t0, time.Now())
	b.Logf("FIGURE: %s %d nodes: load average after idle %s", mode, nodes, loadAvg())

	// Repairs after the idle phase, then the storms, then the VTEP (which
	// flanneld may never put back).
	hands := []*cpHands{cpHandsOf(b, ws[0], mode), cpHandsOf(b, ws[1], mode)}
	cpu0, t0 = cpu(), time.Now()
	cpRepairPhase(b, hands, mode, nodes)
	resources("repairs", cpu0, t0)
	cpu0, t0 = cpu(), time.Now()
	cpRouteStorm(b, hands, mode, nodes)
	resources("route storm", cpu0, t0)
	cpMasqStorm(b, hands, mode, nodes)
	if mode == "vxlan" {
		cpu0, t0 = cpu(), time.Now()
		cpVTEPPhase(b, hands, mode, nodes)
		resources("VTEP repairs", cpu0, t0)
	}
	b.Logf("FIGURE: %s %d nodes: load average at end %s", mode, nodes, loadAvg())
}
