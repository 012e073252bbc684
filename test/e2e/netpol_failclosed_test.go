package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/table"
)

// TestPolicyPendingBeforeFirstCompile: a node on which no policy
// controller has ever compiled (its first boot, or a reboot: no ready file
// in the run directory, no nftables table). On a network with
// "networkPolicy": true every new pod is pending whatever namespace it is
// in (no namespaces file says so): the plugin makes the pending table and
// marks it, and a neighbour's connection to it goes unanswered while the
// node itself (its own traffic, not forwarded) reaches it. On a network
// without the key, the same two pods talk.
func TestPolicyPendingBeforeFirstCompile(t *testing.T) {
	n := NewNode(t)
	run := filepath.Join(n.Dir, "run")
	t.Setenv("VILLAGE_RUN_DIR", run) // the plugins inherit it from libcni
	list := func(name, bridge, subnet string, policy bool) string {
		return fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":%q,"isGateway":true,"networkPolicy":%v,
			"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]]}}]}`, name, bridge, policy, filepath.Join(n.Dir, "ipam"), subnet)
	}
	pair := func(conf string) (a, b *Pod, bIP string) {
		l := ConfList(t, conf)
		a, b = n.NewPod(), n.NewPod()
		testenv.ServeTCP(t, b.NS, "[::]:80", "ok")
		n.MustAdd(l, a)
		bIP = n.MustAdd(l, b).IPs[0].Address.IP.String()
		t.Cleanup(func() { _ = n.Del(l, a); _ = n.Del(l, b) })
		return a, b, bIP
	}

	a, _, bIP := pair(list("fc", "fc0", "10.71.0.0/24", true))
	var pending []string
	must(t, n.in(func() error {
		as, err := table.Pending("fc")
		for _, x := range as {
			pending = append(pending, x.String())
		}
		return err
	}), "listing the pending marks")
	if !slices.Contains(pending, bIP) || len(pending) != 2 {
		t.Fatalf("pending marks %v: want both pods' addresses (%s among them)", pending, bIP)
	}
	if err := dialFrom(a.NS, bIP, 80); err == nil || !isTimeout(err) {
		t.Fatalf("pod -> pod %s before any compile: %v, want an unanswered connection", bIP, err)
	}
	must(t, dialFrom(n.NS, bIP, 80), "node -> pending pod %s (its own traffic)", bIP)

	c, _, dIP := pair(list("open", "open0", "10.72.0.0/24", false))
	must(t, dialFrom(c.NS, dIP, 80), "pod -> pod %s without networkPolicy", dIP)
}

// failClosed runs on TestNetworkPolicyAgents' lab, at its end: node n's
// agent is killed (its ready file stays behind, its lock gone) and, in a
// second round, the node's policy state is wiped as a reboot wipes it
// (run directory files and nftables tables gone; the subnet file stays,
// as the agent republishes it before its controller has compiled). In
// both, a policy appears in a namespace that had none while the agent is
// away, a pod it selects is added, and a prober from far connects to that
// pod's address the whole time, until the agent is back and has compiled
// the pod: no connection is ever answered. A control pod of a namespace
// without a policy, added while the agent is away, is pending too and
// answers once the agent is back.
//
// The prober's control is ctl's port 80 (a pod no policy selects, which
// far reaches throughout): each window the test waits for has a control
// answer, so a prober that reaches nothing cannot pass.
func (l *npLab) failClosed(n *agentNode, far, ctl *npPod) {
	t := l.t
	for _, ns := range []string{"late", "free"} {
		l.namespace(ns)
	}
	l.policyIn("late", "deny-late", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}})
	for round, reboot := range []bool{false, true} {
		_ = n.stop(t, syscall.SIGKILL) // "signal: killed"
		if reboot {
			for _, f := range []string{table.NamespacesName, table.ReadyName, "policy-status.json"} {
				_ = os.Remove(filepath.Join(n.runDir, "agt", f))
			}
			for _, tb := range []string{table.PolicyTable("agt"), table.PendingTable("agt")} {
				inNS(t, n.NS, "nft", "delete", "table", "inet", tb)
			}
		} else if _, err := os.Stat(table.ReadyPath(n.runDir, "agt")); err != nil {
			t.Fatalf("the killed agent's ready file: %v, want it left behind", err)
		}
		name := fmt.Sprintf("late%d", round)
		p := l.podIn(n, "late", name)
		free := l.podIn(n, "free", fmt.Sprintf("ctl%d", round))
		pr := startProber(far.pod.NS, p.ip, target{ctl.ip, 80})
		l.publishIn(n, "free", free)
		pr.waitTries(t, 10) // the window the agent's absence opened before
		if err := dialFrom(far.pod.NS, free.ip, 80); err == nil || !isTimeout(err) {
			t.Fatalf("round %d: far -> pod %s of a namespace without policy while the agent is away: %v, want pending", round, free.ip, err)
		}
		l.start(n)
		l.publishIn(n, "late", p)
		waitFor(t, 60*time.Second, "the free pod answers once the agent compiled it", func() (bool, string) {
			err := dialFrom(far.pod.NS, free.ip, 80)
			return err == nil, fmt.Sprint(err, "\n", n.log.String())
		})
		l.statusLine(n, "kernel matches")
		pr.waitTries(t, 10)
		tries, got := pr.stop()
		if got != 0 {
			t.Fatalf("round %d (reboot %v): %d of %d connections reached %s, which deny-late selects (%s)", round, reboot, got, tries, p.ip, pr)
		}
		t.Logf("round %d (reboot %v): new pod while the agent was away and came back: %s", round, reboot, pr)
	}
}

// podIn adds a pod named name in namespace ns on n, serving on port 80.
func (l *npLab) podIn(n *agentNode, ns, name string) *npPod {
	p := n.NewPod()
	testenv.ServeTCP(l.t, p.NS, "[::]:80", "ok")
	r := addK8s(l.t, n, l.list, p, ns, name)
	return &npPod{pod: p, name: name, ip: r.IPs[0].Address.IP.String()}
}

// publishIn writes the Pod object of p in namespace ns as kubelet would.
func (l *npLab) publishIn(n *agentNode, ns string, p *npPod) {
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.name, Labels: map[string]string{"app": p.name}},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	obj, err := l.kube.Client.CoreV1().Pods(ns).Create(l.ctx, obj, metav1.CreateOptions{})
	must(l.t, err, "creating Pod %s/%s", ns, p.name)
	obj.Status.Phase = corev1.PodRunning
	obj.Status.PodIP, obj.Status.PodIPs = p.ip, []corev1.PodIP{{IP: p.ip}}
	_, err = l.kube.Client.CoreV1().Pods(ns).UpdateStatus(l.ctx, obj, metav1.UpdateOptions{})
	must(l.t, err, "writing the status of Pod %s/%s", ns, p.name)
}

func (l *npLab) policyIn(ns, name string, spec networkingv1.NetworkPolicySpec) {
	_, err := l.kube.Client.NetworkingV1().NetworkPolicies(ns).Create(l.ctx,
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}, metav1.CreateOptions{})
	must(l.t, err, "creating NetworkPolicy %s/%s", ns, name)
}
