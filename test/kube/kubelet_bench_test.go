package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
)

// BenchmarkKubeletPodStart times pod creation to Ready under a real
// kubelet on one node of one cluster, with the CNI swapped between
// suites (A B A B): Village from its shipped DaemonSet, then the
// reference bridge + host-local (+ portmap and bandwidth, as Village's conflist has)
// with a conflist for the node's podCIDR. Same node, same containerd,
// same kubelet: only the plugin differs. The node's maxPods is 120, so
// the 110 pods of a burst fit beside Village's DaemonSet pod. Times are
// on the one clock every process here shares: the start of the Create
// call to the watch event showing PodReady=True (milliseconds); the
// API's creationTimestamp -> PodReady lastTransitionTime (one-second
// resolution) is printed beside them, and so is each pod's start split by
// the CRI calls in containerd's log, with the CPU the node's processes
// used over the suite (podstart_split_test.go).
func BenchmarkKubeletPodStart(b *testing.B) {
	c := kubecluster.Start(b, kubecluster.Options{Nodes: 1, MaxPods: 120})
	n := c.Nodes()[0]
	refDir := os.Getenv("VILLAGE_REF_BIN_DIR")
	if refDir == "" {
		root, err := testenv.ModuleRoot()
		if err != nil {
			b.Fatal(err)
		}
		refDir = filepath.Join(root, "bin", "ref")
	}
	rounds := testenv.EnvCount("VILLAGE_KUBELET_BENCH_ROUNDS", 2, 1)
	serial, burst := 30, 110
	for range b.N {
		for r := range rounds {
			for _, suite := range []string{"village", "ref"} {
				switchCNI(b, c, n, suite, refDir)
				runSuite(b, c, n, fmt.Sprintf("%s-serial-%d", suite, r), serial, false)
				runSuite(b, c, n, fmt.Sprintf("%s-burst-%d", suite, r), burst, true)
			}
		}
	}
}

// switchCNI leaves exactly one CNI configured on the node.
func switchCNI(b *testing.B, c *kubecluster.Cluster, n *kubecluster.Node, suite, refDir string) {
	b.Helper()
	ctx := context.Background()
	ds := c.Client().AppsV1().DaemonSets(kubecluster.VillageNamespace)
	if suite == "ref" {
		if out, err := c.Kubectl("-n", kubecluster.VillageNamespace, "delete", "daemonset", "village", "--wait=true", "--ignore-not-found"); err != nil {
			b.Fatalf("delete village: %v\n%s", err, out)
		}
		if err := kubecluster.Poll(3*time.Minute, func() error {
			l, err := c.Client().CoreV1().Pods(kubecluster.VillageNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubecluster.VillageSelector})
			if err != nil {
				return err
			}
			if len(l.Items) > 0 {
				return fmt.Errorf("%d village pods remain", len(l.Items))
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		conf := map[string]any{
			"cniVersion": "1.0.0", "name": "refbridge",
			"plugins": []any{map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": node.Spec.PodCIDR}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
			}, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
				map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}}},
		}
		js, _ := json.Marshal(conf)
		script := fmt.Sprintf("rm -f /etc/cni/net.d/*village*; cp %s/bridge %s/host-local %s/loopback %s/portmap %s/bandwidth /opt/cni/bin/ && printf '%%s' '%s' > /etc/cni/net.d/10-refbridge.conflist",
			refDir, refDir, refDir, refDir, refDir, js)
		if out, err := n.Exec("sh", "-c", script); err != nil {
			b.Fatalf("install reference: %v\n%s", err, out)
		}
	} else {
		if out, err := n.Exec("sh", "-c", "rm -f /etc/cni/net.d/10-refbridge.conflist"); err != nil {
			b.Fatalf("remove reference: %v\n%s", err, out)
		}
		if _, err := ds.Get(ctx, "village", metav1.GetOptions{}); err != nil {
			root, _ := testenv.ModuleRoot()
			if out, err := c.Kubectl("apply", "-f", filepath.Join(root, "deploy", "kubernetes", "daemonset.yaml")); err != nil {
				b.Fatalf("apply village: %v\n%s", err, out)
			}
		}
		if err := c.WaitVillageReady(5 * time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.WaitNodeReady(n.Name, 3*time.Minute); err != nil {
		b.Fatal(err)
	}
}

func runSuite(b *testing.B, c *kubecluster.Cluster, n *kubecluster.Node, name string, count int, parallel bool) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := c.Client()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := kubecluster.Poll(wait, func() error {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	w := podWatch(b, ctx, c, name)
	var mu sync.Mutex
	created := map[string]time.Time{}
	ready := map[string]time.Time{}
	apiLat := map[string]time.Duration{}
	writes := map[string]int{} // versions of the pod the watch showed before its Ready one
	readyCh := make(chan string, count*2)
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				b.Logf("%s: watch event %s: %v", name, ev.Type, ev.Object)
				continue
			}
			if ev.Type == watch.Deleted {
				continue
			}
			if !podReady(p) {
				mu.Lock()
				if _, seen := ready[p.Name]; !seen {
					writes[p.Name]++
				}
				mu.Unlock()
				continue
			}
			now := time.Now()
			mu.Lock()
			if _, seen := ready[p.Name]; !seen {
				ready[p.Name] = now
				for _, cd := range p.Status.Conditions {
					if cd.Type == corev1.PodReady {
						apiLat[p.Name] = cd.LastTransitionTime.Sub(p.CreationTimestamp.Time)
					}
				}
				readyCh <- p.Name
			}
			mu.Unlock()
		}
	}()
	create := func(i int) {
		p := podSpec(fmt.Sprintf("p%03d", i), n.Name, corev1.RestartPolicyAlways)
		mu.Lock()
		created[p.Name] = time.Now()
		mu.Unlock()
		if _, err := cs.CoreV1().Pods(name).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Errorf("pod %s: %v", p.Name, err)
		}
	}
	logBefore := len(cniLogLines(n))
	crdLog := n.LogPath("containerd")
	crdOffset := fileSize(crdLog)
	cpu0 := sampleCPU()
	deadline := time.After(15 * time.Minute)
	waitReady := func(what string) {
		select {
		case <-readyCh:
		case <-deadline:
			b.Fatalf("%s: %s not Ready within 15 minutes", name, what)
		}
	}
	start := time.Now()
	if parallel {
		var wg sync.WaitGroup
		for i := range count {
			wg.Add(1)
			go func() { defer wg.Done(); create(i) }()
		}
		wg.Wait()
		for i := range count {
			waitReady(fmt.Sprintf("%d of %d pods", count-i, count))
		}
	} else {
		for i := range count {
			create(i)
			waitReady(fmt.Sprintf("pod %d", i))
		}
	}
	wall := time.Since(start)
	cpu1 := sampleCPU()
	w.Stop()
	var obs, api []time.Duration
	var before []int
	mu.Lock()
	for p, t := range ready {
		obs = append(obs, t.Sub(created[p]))
		api = append(api, apiLat[p])
		before = append(before, writes[p])
	}
	mu.Unlock()
	evs, err := cs.CoreV1().Events(name).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("reason", "FailedCreatePodSandBox").String()})
	if err != nil {
		b.Fatalf("%s: events: %v", name, err)
	}
	failed := 0
	for _, e := range evs.Items {
		failed += int(e.Count)
	}
	// The plugin's own share: the duration_ms of the ADDs this suite
	// caused in Village's logFile, village's (which includes its IPAM
	// plugin's exec) and village-ipam's apart; measured inside each
	// process, so without its exec and Go start. The reference plugins
	// log nothing.
	adds := map[string][]time.Duration{}
	addFailed := 0
	steps := addSteps{}
	logAfter := cniLogLines(n)
	for _, l := range logAfter[min(logBefore, len(logAfter)):] {
		var e pluginLine
		if json.Unmarshal([]byte(l), &e) != nil {
			continue
		}
		switch e.Msg {
		case "ADD ok":
			adds[e.Plugin] = append(adds[e.Plugin], msDuration(e.DurationMS))
			steps.add(e)
		case "ADD failed":
			addFailed++
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	// How many versions of each pod the API held before the Ready one (the
	// create, the scheduler's binding, kubelet's status writes): more writes
	// per pod mean a longer queue in kubelet's status manager.
	slices.Sort(before)
	if len(before) > 0 {
		fmt.Printf("FIGURE kubelet %s versions before Ready per pod p50=%d max=%d\n", name, before[len(before)/2], before[len(before)-1])
	}
	fmt.Printf("FIGURE kubelet %s pods=%d observed p50=%v p99=%v max=%v wall=%v api(1s res) p50=%v p99=%v max=%v failedSandbox=%d "+
		"villageADD n=%d p50=%v p99=%v max=%v ipamADD n=%d p50=%v p99=%v addFailed=%d load=%s\n",
		name, count, pct(obs, 50), pct(obs, 99), pct(obs, 100), wall.Round(time.Millisecond),
		pct(api, 50), pct(api, 99), pct(api, 100), failed,
		len(adds["village"]), pct(adds["village"], 50), pct(adds["village"], 99), pct(adds["village"], 100),
		len(adds["village-ipam"]), pct(adds["village-ipam"], 50), pct(adds["village-ipam"], 99), addFailed,
		strings.TrimSpace(string(load)))
	steps.print(name)
	// The split of each pod's start by containerd's log: Create call ->
	// RunPodSandbox called (the API, the scheduler, kubelet's pod worker);
	// the sandbox (runc's pause container, the CNI ADD); sandbox ->
	// container started (CreateContainer, StartContainer); started ->
	// Ready seen in the watch (kubelet's PLEG and status manager, the API).
	stages, err := containerdStages(crdLog, crdOffset, name)
	if err != nil {
		b.Fatalf("%s: containerd log: %v", name, err)
	}
	var toSandbox, sandbox, toStarted, toReady, running []time.Duration
	mu.Lock()
	for p, st := range stages {
		c, r := created[p], ready[p]
		if c.IsZero() || r.IsZero() || st.sandboxBegin.IsZero() || st.sandboxEnd.IsZero() || st.started.IsZero() {
			continue
		}
		toSandbox = append(toSandbox, st.sandboxBegin.Sub(c))
		sandbox = append(sandbox, st.sandboxEnd.Sub(st.sandboxBegin))
		toStarted = append(toStarted, st.started.Sub(st.sandboxEnd))
		toReady = append(toReady, r.Sub(st.started))
		running = append(running, st.started.Sub(c))
	}
	mu.Unlock()
	stage := func(d []time.Duration) string { return fmt.Sprintf("%v/%v", pct(d, 50), pct(d, 99)) }
	fmt.Printf("FIGURE kubelet %s split p50/p99 (n=%d): create->RunPodSandbox=%s RunPodSandbox=%s sandbox->started=%s started->Ready=%s; create->started=%s\n",
		name, len(sandbox), stage(toSandbox), stage(sandbox), stage(toStarted), stage(toReady), stage(running))
	fmt.Printf("FIGURE kubelet %s CPU over the suite (%v): %s\n", name, wall.Round(time.Millisecond), cpu1.since(cpu0))
	// Through the API and waited for here: kubectl runs under the
	// harness's 2-minute bound, and 110 reference pods took longer.
	began := time.Now()
	if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		b.Fatalf("delete %s: %v", name, err)
	}
	if err := kubecluster.Poll(20*time.Minute, func() error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("namespace %s still there", name)
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("FIGURE kubelet %s teardown (namespace delete to gone, %d pods)=%v\n", name, count, time.Since(began).Round(time.Millisecond))
}

// podWatch watches the pods of namespace from its current
// resourceVersion through client-go's RetryWatcher, which opens the watch
// again from the last resourceVersion whenever it ends (two earlier runs
// waited forever on a watch that had ended after the first pod). Its
// client has no request timeout: the cluster client's 15 s would end
// every watch.
func podWatch(b *testing.B, ctx context.Context, c *kubecluster.Cluster, namespace string) watch.Interface {
	b.Helper()
	wcfg := rest.CopyConfig(c.API().Config)
	wcfg.Timeout = 0
	wcs, err := kubernetes.NewForConfig(wcfg)
	if err != nil {
		b.Fatal(err)
	}
	pods := wcs.CoreV1().Pods(namespace)
	l, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, o)
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return w
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	if i > len(s) {
		i = len(s)
	}
	return s[i-1].Round(time.Millisecond)
}

// cniLogLines is Village's CNI log on the node (none: nil).
func cniLogLines(n *kubecluster.Node) []string {
	out, err := n.Exec("sh", "-c", "cat /var/log/village/cni.log 2>/dev/null || true")
	if err != nil || len(out) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n")
}
