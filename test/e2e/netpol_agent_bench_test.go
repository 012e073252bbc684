package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/google/nftables"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/table"
)

// BenchmarkNetpolAgent (scripts/bench.sh -only netpol): one real villaged
// with "networkPolicy": true watching a real kube-apiserver that holds
// 1,000 Pods of its node in 10 namespaces and 100 policies (the world of
// pkg/netpol's benchmarks: each policy isolates one app of its namespace
// and allows two other apps of every namespace on a port). It reports the
// agent's RSS once all is compiled, and the time from a policy's update
// in the API to its rule in the node's kernel (the watch, the 100 ms
// settle, the compile and the transaction), polled with nft back to back
// (one listing takes a few milliseconds: the resolution). Then 110 more
// pods land on the node, written as kubelet writes them (netpolBurst),
// once all at once and once paced as a busy kubelet starts them: the
// agent's CPU for each burst and its compiles.
func BenchmarkNetpolAgent(b *testing.B) {
	const pods, policies, changes = 1000, 100, 10
	lan := NewLAN(b)
	host := testenv.NewNS(b)
	lan.Attach(b, host, "eth0", agentEtcdIP+"/24")
	kube := kubetest.Start(b, kubetest.Options{NetNS: host, IP: agentEtcdIP})
	ctx := context.Background()
	api := kube.Client
	applyRBAC(b, kube) // the agent as the DaemonSet runs it (see startWatcher)
	self := NewNode(b)
	lan.Attach(b, self.NS, "lan0", agentLANPrefix+"11/24")
	if _, err := api.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "watcher"},
		Spec: corev1.NodeSpec{PodCIDR: "10.70.1.0/24", PodCIDRs: []string{"10.70.1.0/24"}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	conf := filepath.Join(b.TempDir(), "agt.conflist")
	text := strings.Replace(kubeConflist("vxlan", filepath.Join(self.Dir, "ipam"), kube.NodeAgentKubeconfig), `"ipMasq":true,`, `"ipMasq":true,"networkPolicy":true,`, 1)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		b.Fatal(err)
	}
	runDir := filepath.Join(self.Dir, "run")
	pid, log := startWatcher(ctx, b, kube, self, conf)
	rssStart := rss(b, pid)

	for n := range 10 {
		if _, err := api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", n),
			Labels: map[string]string{"team": fmt.Sprint(n % 3)}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		// no kube-controller-manager here to make it
		if _, err := api.CoreV1().ServiceAccounts(fmt.Sprintf("ns%d", n)).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	began := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("p%d", i),
					Labels: map[string]string{"app": fmt.Sprintf("app%d", i%50)}},
					Spec: corev1.PodSpec{NodeName: "watcher", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
				made, err := api.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
				if err != nil {
					b.Error(err)
					continue
				}
				ip := fmt.Sprintf("10.200.%d.%d", i/250, i%250+2)
				made.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
				if _, err := api.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, made, metav1.UpdateOptions{}); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range pods {
		work <- i
	}
	close(work)
	wg.Wait()
	policy := func(j, port int) *networkingv1.NetworkPolicy {
		tcp, p := corev1.ProtocolTCP, intstr.FromInt32(int32(port))
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", j%10), Name: fmt.Sprintf("pol%d", j)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", j%50)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{
						{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", (j+1)%50)}}},
						{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", (j+2)%50)}}},
						{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.1.0/24"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}}}}}
	}
	for j := range policies {
		if _, err := api.NetworkingV1().NetworkPolicies(fmt.Sprintf("ns%d", j%10)).Create(ctx, policy(j, 80+j%5), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	waitUntil(b, 5*time.Minute, "100 policies over 1,000 isolated pods compiled", func() bool {
		st, err := controller.ReadStatus(runDir, "agt")
		return err == nil && st != nil && st.Policies == policies && st.Compiled == pods && st.Pods == pods && st.Error == ""
	}, log)
	b.Logf("FIGURE: %d pods and %d policies written and compiled in %s", pods, policies, time.Since(began).Round(time.Millisecond))
	rssCompiled := rss(b, pid)

	// pol0 selects app0 of ns0: p0, p50, … Its port goes 1001, 1002,
	// 1001, …: no other policy has them.
	chain := "in.ns0/p0"
	var lat []time.Duration
	for i := range changes {
		port := 1001 + i%2
		cur, err := api.NetworkingV1().NetworkPolicies("ns0").Get(ctx, "pol0", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		want := policy(0, port)
		want.ResourceVersion = cur.ResourceVersion
		start := time.Now()
		if _, err := api.NetworkingV1().NetworkPolicies("ns0").Update(ctx, want, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		// polled back to back (waitUntil's 50 ms would be the resolution)
		for {
			out, err := exec.Command("ip", "netns", "exec", filepath.Base(self.NS.Path()), "nft", "list", "chain", "inet", table.PolicyTable("agt"), chain).Output()
			if err == nil && strings.Contains(string(out), fmt.Sprintf("tcp dport %d ", port)) {
				break
			}
			if time.Since(start) > time.Minute {
				b.Fatalf("port %d not in chain %s within a minute; agent log:\n%s", port, chain, tailString(log.String(), 3000))
			}
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	netpolTableRepairs(b, self, log)
	netpolBurst(ctx, b, api, pid, runDir, log, burstShape{name: "at-once", before: pods})
	// kubelet on a busy node starts 110 pods over tens of seconds and
	// writes each one's status about once a second as it starts
	netpolBurst(ctx, b, api, pid, runDir, log, burstShape{name: "paced", before: pods + burstPods, spread: 30 * time.Second, gap: time.Second})
	rssEnd := rss(b, pid)
	b.Logf("FIGURE: policy update in the API -> its rule in the kernel (%d pods, %d policies, %d updates): median %s, min %s, max %s",
		pods, policies, changes, lat[len(lat)/2].Round(time.Millisecond), lat[0].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	b.Logf("FIGURE: agent RSS: %.1f MiB before the pods, %.1f MiB with %d pods and %d policies compiled, %.1f MiB after %d updates and the bursts",
		float64(rssStart)/(1<<20), float64(rssCompiled)/(1<<20), pods, policies, float64(rssEnd)/(1<<20), changes)
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "ms-median-update-to-kernel")
	b.ReportMetric(float64(rssCompiled)/(1<<20), "MiB-rss")
	if lines := strings.Count(log.String(), "network policy (change)"); lines == 0 {
		b.Logf("agent log:\n%s", tailString(log.String(), 3000))
	}
}

// burstPods is kubelet's default maxPods.
const burstPods = 110

// burstShape is when a burst's writes come: pod i is created at
// i*spread/burstPods and its status writes follow gap apart (all at once
// when both are zero).
type burstShape struct {
	name        string
	before      int // local pods already compiled
	spread, gap time.Duration
}

// netpolBurst creates 110 pods on the watcher's node (kubelet's maxPods,
// as a drain or a reboot brings them) and moves each through the status
// writes kubelet makes for a starting pod: Pending with its conditions,
// Running with its address, Ready. Every pod is isolated by a policy of
// BenchmarkNetpolAgent. It reports villaged's CPU from the first write
// until the status file has every pod compiled, the compiles that changed
// the kernel, and the time from the last write to the last compile.
func netpolBurst(ctx context.Context, b *testing.B, api kubernetes.Interface, pid int, runDir string, log *lockedBuffer, shape burstShape) {
	const burst = burstPods
	before := shape.before
	compiles0 := strings.Count(log.String(), "network policy (change)")
	cpu0 := cpuTime(b, pid)
	began := time.Now()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		st := corev1.ConditionFalse
		if ok {
			st = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: st, LastTransitionTime: metav1.Now()}
	}
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * shape.spread / burst)
			ns, name := fmt.Sprintf("ns%d", i%10), fmt.Sprintf("%s%d", shape.name, i)
			pods := api.CoreV1().Pods(ns)
			p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				Labels: map[string]string{"app": fmt.Sprintf("app%d", i%50)}},
				Spec: corev1.PodSpec{NodeName: "watcher", Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
			if err != nil {
				b.Error(err)
				return
			}
			ip := fmt.Sprintf("10.201.%d.%d", before/burst, i+2)
			steps := []corev1.PodStatus{
				{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
					cond(corev1.ContainersReady, false), cond(corev1.PodReady, false)},
					ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "none", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}},
				{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, Conditions: []corev1.PodCondition{cond(corev1.PodScheduled, true),
					cond(corev1.PodInitialized, true), cond(corev1.ContainersReady, false), cond(corev1.PodReady, false)},
					ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "none", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}},
				{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, Conditions: []corev1.PodCondition{cond(corev1.PodScheduled, true),
					cond(corev1.PodInitialized, true), cond(corev1.ContainersReady, true), cond(corev1.PodReady, true)},
					ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Image: "none", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}},
			}
			for _, st := range steps {
				time.Sleep(shape.gap)
				p.Status = st
				if p, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	written := time.Now()
	waitUntil(b, 5*time.Minute, "the burst's pods compiled", func() bool {
		st, err := controller.ReadStatus(runDir, "agt")
		return err == nil && st != nil && st.Compiled == before+burst && st.Pods == before+burst && st.Error == ""
	}, log)
	compiled := time.Now()
	// a compile still running on the last writes' events: read the CPU
	// once it ended (the counter holds still)
	cpu := cpuSettled(b, pid) - cpu0
	compiles := strings.Count(log.String(), "network policy (change)") - compiles0
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("FIGURE: a burst of %d pods %s (4 writes each) next to %d: agent CPU %v (%v per pod), %d compiles that changed the kernel, "+
		"writes took %v, compiled %v after the last write; load %s", burst, shape.name, before, cpu.Round(time.Millisecond), (cpu / burst).Round(10*time.Microsecond),
		compiles, written.Sub(began).Round(time.Millisecond), compiled.Sub(written).Round(time.Millisecond), strings.TrimSpace(string(load)))
	b.ReportMetric(float64(cpu.Milliseconds()), "ms-cpu-110-pods-"+shape.name)
}

// netpolTableRepairs deletes the policy table, then the pending table, by
// hand (`nft delete table inet …`, sent over netlink from here: an nft
// command's start would be in the figure), 20 times each, one at a time,
// and reports the time from the deletion to the table back with as many
// chains as before: the agent's repair from the nftables notification,
// through the code that writes the table. Polled through netlink every
// millisecond (a listing costs well under one). Each sample starts once
// the last one's repair has logged its write.
func netpolTableRepairs(b *testing.B, self *Node, log *lockedBuffer) {
	const samples = 20
	c, err := nftables.New(nftables.WithNetNSFd(int(self.NS.Fd())))
	if err != nil {
		b.Fatal(err)
	}
	defer c.CloseLasting()
	chains := func(name string) int {
		all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			b.Fatalf("listing chains: %v", err)
		}
		n := 0
		for _, ch := range all {
			if ch.Table.Name == name {
				n++
			}
		}
		return n
	}
	var lines []string
	for _, name := range []string{table.PolicyTable("agt"), table.PendingTable("agt")} {
		want := chains(name)
		if want == 0 {
			lines = append(lines, fmt.Sprintf("table %s: none on the node", name))
			continue
		}
		var lat []time.Duration
		for range samples {
			written := strings.Count(log.String(), " in the kernel after ")
			c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
			t0 := time.Now()
			if err := c.Flush(); err != nil {
				b.Fatalf("deleting table inet %s: %v", name, err)
			}
			for chains(name) != want {
				if time.Since(t0) > time.Minute {
					b.Fatalf("table %s not back with its %d chains within a minute; agent log:\n%s", name, want, tailString(log.String(), 3000))
				}
				time.Sleep(time.Millisecond)
			}
			lat = append(lat, time.Since(t0))
			// The repair's end (a pending table comes back before the
			// compile that follows it): the next sample starts after it,
			// not during it.
			testenv.WaitFor(b, "the repair's write of table "+name+" logged", func() error {
				if strings.Count(log.String(), " in the kernel after ") == written {
					return fmt.Errorf("not in the agent log:\n%s", tailString(log.String(), 3000))
				}
				return nil
			})
		}
		slices.Sort(lat)
		lines = append(lines, fmt.Sprintf("table %s (%d chains): p50 %s p99 %s max %s (n=%d)", name, want, pctMicro(lat, 50), pctMicro(lat, 99), pctMicro(lat, 100), len(lat)))
	}
	b.Logf("FIGURE: NetworkPolicy table deleted by hand -> back whole (1,000 pods, 100 policies): %s; load %s", strings.Join(lines, "; "), loadAvg())
}
