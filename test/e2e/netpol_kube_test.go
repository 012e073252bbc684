package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/table"
)

// TestNetworkPolicyAgents runs the real `villaged run` with
// "networkPolicy": true on three node namespaces of a kube-apiserver the
// test starts (the agents authenticate as the DaemonSet's ServiceAccount,
// bound only by deploy/kubernetes/rbac.yaml). Pods are added by the real
// plugins with kubelet's CNI_ARGS; the test plays kubelet by writing the
// Pod objects with their addresses. Traffic proves what is enforced:
// across nodes (the VXLAN overlay into node1's forward hook), on one
// node (bridged), named ports, a deleted policy, an agent restart, the
// pending mark of a new pod (a loop of connections while it starts),
// `villaged status`, `villaged why` and `villaged drops`.
func TestNetworkPolicyAgents(t *testing.T) {
	lab := newKubeLab(t, "vxlan")
	text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"agt","plugins":[{"type":"village","bridge":"village0","isDefaultGateway":true,
		"ipMasq":true,"clusterCIDR":%q,"networkPolicy":true,
		"ipam":{"type":"village-ipam","dataDir":%q},
		"backend":{"type":"vxlan","underlay":"lan0","vni":9,
			"registry":{"type":"kubernetes","kubeconfig":%q}}}]}`, agentCluster, filepath.Join(t.TempDir(), "ipam"), lab.kube.NodeAgentKubeconfig)
	must(t, os.WriteFile(lab.conf, []byte(text), 0o644), "writing the conflist")
	lab.list = ConfList(t, text)
	for i, n := range lab.nodes {
		lab.createNode(n, fmt.Sprintf("10.70.%d.0/24", i+1))
	}
	lab.startAll()
	np := &npLab{kubeLab: lab, ctx: context.Background()}
	np.namespace("np")
	n1, n2 := lab.nodes[0], lab.nodes[1]
	web := np.pod(n1, "web", true)     // node1
	local := np.pod(n1, "local", true) // node1, same bridge
	far := np.pod(n2, "far", true)     // node2
	np.waitCompiled(n1, 2, 0)
	np.reach(far, web, 80, true)
	np.reach(local, web, 8080, true)

	// deny all ingress to web; node1 itself still reaches it (kubelet)
	np.policy("deny-web", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}})
	np.waitCompiled(n1, 2, 1)
	np.reach(far, web, 80, false)
	np.reach(local, web, 8080, false)
	must(t, dialFrom(n1.NS, web.ip, 80), "node1 -> web (the node's own traffic)")

	// allow far to web's named port "alt" (8080)
	alt := intstr.FromString("alt")
	np.policy("far-to-web", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "far"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &alt}}}}})
	np.waitPolicies(n1, 2)
	np.reach(far, web, 8080, true)
	np.reach(far, web, 80, false)
	np.reach(local, web, 8080, false)
	np.statusLine(n1, "network policy: 2 policies, 2 local pods compiled, 1 isolated; kernel matches")
	// villaged why agrees with the traffic, API server or not
	// (netpol_why_test.go)
	np.why(n1, n2, far, web, local)
	// what the policies drop, counted and named (netpol_drops_test.go)
	np.drops(n1, web, local, far)

	// restart: the tables stay while the agent is down, and it takes over
	must(t, n1.stop(t, syscall.SIGTERM), "stopping villaged on node1")
	np.reach(local, web, 8080, false)
	np.reach(far, web, 8080, true)
	lab.start(n1)
	np.reach(local, web, 8080, false)

	// no window: a new pod a deny policy selects is never reachable
	np.newPodNeverReachable(n1, far, target{web.ip, 8080}) // far-to-web allows 8080
	// ... and a new pod of that namespace nothing selects is reachable
	// once its agent has seen it
	np.newPodReachable(n1, far)

	// a deleted policy's rules go
	must(t, lab.kube.Client.NetworkingV1().NetworkPolicies("np").Delete(np.ctx, "deny-web", metav1.DeleteOptions{}), "deleting deny-web")
	np.waitPolicies(n1, 2) // far-to-web and deny-new
	np.reach(far, web, 8080, true)
	np.reach(far, web, 80, false) // far-to-web still isolates web
	must(t, lab.kube.Client.NetworkingV1().NetworkPolicies("np").Delete(np.ctx, "far-to-web", metav1.DeleteOptions{}), "deleting far-to-web")
	np.waitPolicies(n1, 1)
	np.reach(far, web, 80, true)
	np.reach(local, web, 8080, true)

	// deleted and flushed tables are put back by the agent's nf_tables
	// notifications (node1's agent restarted with --period 1h), and a pod added between a flush
	// and the repair is pending (netpol_flush_test.go)
	np.policy("deny-web", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}})
	np.waitPolicies(n1, 2)
	np.reach(far, web, 80, false)
	np.flushRuleset(n1, far, web, local)

	// fail closed while the agent is away or after a reboot
	// (netpol_failclosed_test.go)
	np.failClosed(n1, far, local)
	// villaged's metrics endpoint exposes the policy compiles
	np.metrics(n1)
	// ... and each pod's traffic, counted by its host veth
	np.podTraffic(n1, web, local)
	// a policy part that is not enforced is said on the policy
	np.notEnforcedEvent(n1)
	// networkPolicy on -> off: the table and the files go
	np.turnOff(n1, far, web)
}

// podTraffic: n's villaged counts what one pod sends another in
// village_pod_transmit_bytes_total and village_pod_receive_bytes_total,
// named by the Pod objects: from sends 32 MiB over TCP to to (on n, to
// not isolated), and each counter grows by at least the bytes the
// receiving socket counted and by no more than their headers' worth (at
// most 6 %: a 1500-byte MTU without segmentation offload; with it, about
// 0.1 %).
func (l *npLab) podTraffic(n *agentNode, from, to *npPod) {
	t := l.t
	const size = 32 << 20
	series := func(dir string, p *npPod) string {
		return fmt.Sprintf(`village_pod_%s_bytes_total{namespace="np",pod=%q}`, dir, p.name)
	}
	read := func() (sent, got float64, body string) {
		body, code := httpGetIn(t, n.NS, "http://127.0.0.1:9696/metrics")
		if code != http.StatusOK {
			return -1, -1, body
		}
		return metricValue(body, series("transmit", from)), metricValue(body, series("receive", to)), body
	}
	var sent0, got0 float64
	waitFor(t, 60*time.Second, n.name+"'s /metrics names "+from.name+" and "+to.name, func() (bool, string) {
		var body string
		sent0, got0, body = read()
		return sent0 >= 0 && got0 >= 0, body
	})
	var ln net.Listener
	must(t, testenv.InNS(to.pod.NS, func() (err error) {
		ln, err = net.Listen("tcp", "[::]:9100")
		return err
	}), "listening in %s", to.name)
	defer ln.Close()
	counted := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			counted <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		counted <- n
	}()
	must(t, testenv.InNS(from.pod.NS, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(to.ip, "9100"), 30*time.Second)
		if err != nil {
			return err
		}
		if _, err := c.Write(make([]byte, size)); err != nil {
			c.Close()
			return err
		}
		return c.Close()
	}), "sending %d bytes from %s to %s", size, from.name, to.name)
	payload := <-counted
	if payload != size {
		t.Fatalf("%s received %d bytes of %d", to.name, payload, size)
	}
	sent1, got1, body := read()
	dSent, dGot := sent1-sent0, got1-got0
	t.Logf("pod traffic: %d payload bytes; %s transmit +%.0f (%.4f×), %s receive +%.0f (%.4f×)",
		size, from.name, dSent, dSent/size, to.name, dGot, dGot/size)
	for _, d := range []struct {
		what string
		v    float64
	}{{series("transmit", from), dSent}, {series("receive", to), dGot}} {
		if d.v < size || d.v > size*1.06 {
			t.Errorf("%s grew by %.0f for %d payload bytes, want within [1, 1.06]×:\n%s", d.what, d.v, size, body)
		}
	}
}

// metrics: n's villaged serves the netpol metrics on its metrics endpoint
// (the node's loopback), counting the compiles it made and the pods it
// isolates.
func (l *npLab) metrics(n *agentNode) {
	waitFor(l.t, 60*time.Second, n.name+"'s /metrics has the network policy metrics", func() (bool, string) {
		body, code := httpGetIn(l.t, n.NS, "http://127.0.0.1:9696/metrics")
		return code == http.StatusOK &&
			metricAtLeast(body, `village_netpol_compiles_total{network="agt"}`, 1) &&
			metricAtLeast(body, `village_netpol_compile_duration_seconds_count{network="agt"}`, 1) &&
			metricAtLeast(body, `village_netpol_pods{network="agt"}`, 1), body
	})
}

// notEnforcedEvent: a policy that selects a hostNetwork pod of n cannot
// filter it (its traffic is the node's own); n's agent says so in a
// NetworkPolicyNotEnforced Warning Event on that very policy, and its
// problems gauge counts it.
//
// A pod whose village.cni.io/lan-address a user wrote (issue 38: users may
// edit annotations) has no LAN interface: the same policy selects it, the
// compile holds its chain, and no problem or Event names it as a LAN pod
// (the warning comes from the node's own state, pkg/lanpods HasLAN).
func (l *npLab) notEnforcedEvent(n *agentNode) {
	t := l.t
	forged := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: "forged", Labels: map[string]string{"app": "hostpod"},
		Annotations: map[string]string{kubenames.AnnotationLANAddress: "net1=192.168.50.99/24"}},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	created, err := l.kube.Client.CoreV1().Pods("np").Create(l.ctx, forged, metav1.CreateOptions{})
	must(t, err, "creating Pod forged with a forged lan-address annotation")
	// an address as kubelet would post it (the compile skips pods without
	// one); no sandbox holds it, nothing is sent to it
	created.Status.Phase, created.Status.PodIP, created.Status.PodIPs = corev1.PodRunning, "10.70.1.250", []corev1.PodIP{{IP: "10.70.1.250"}}
	_, err = l.kube.Client.CoreV1().Pods("np").UpdateStatus(l.ctx, created, metav1.UpdateOptions{})
	must(t, err, "posting Pod forged's address")
	hp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: "hostpod", Labels: map[string]string{"app": "hostpod"}},
		Spec: corev1.PodSpec{NodeName: n.name, HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	_, err = l.kube.Client.CoreV1().Pods("np").Create(l.ctx, hp, metav1.CreateOptions{})
	must(t, err, "creating the hostNetwork Pod hostpod")
	l.policy("deny-host", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hostpod"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}})
	pol, err := l.kube.Client.NetworkingV1().NetworkPolicies("np").Get(l.ctx, "deny-host", metav1.GetOptions{})
	must(t, err, "reading NetworkPolicy deny-host")
	waitFor(t, 60*time.Second, "a NetworkPolicyNotEnforced Event on deny-host", func() (bool, string) {
		evs, err := l.kube.Client.CoreV1().Events("np").List(l.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=deny-host"})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, fmt.Sprintf("%s %s %s/%s: %s", e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.UID, e.Message))
			if e.Reason == "NetworkPolicyNotEnforced" && e.Type == corev1.EventTypeWarning &&
				e.InvolvedObject.Kind == "NetworkPolicy" && e.InvolvedObject.UID == pol.UID &&
				strings.Contains(e.Message, "node "+n.name+": ") && strings.Contains(e.Message, "hostNetwork pod np/hostpod") {
				return true, ""
			}
		}
		return false, strings.Join(seen, "\n")
	})
	waitFor(t, 60*time.Second, n.name+"'s problems gauge counting deny-host", func() (bool, string) {
		body, _ := httpGetIn(t, n.NS, "http://127.0.0.1:9696/metrics")
		return metricAtLeast(body, `village_netpol_problems{network="agt"}`, 1), body
	})
	var st *controller.Status
	waitFor(t, 60*time.Second, n.name+" compiled deny-host over np/forged", func() (bool, string) {
		st, err = controller.ReadStatus(n.runDir, "agt")
		if err != nil || st == nil {
			return false, fmt.Sprint(err)
		}
		return slices.Contains(st.Want.Chains, "in.np/forged") && slices.ContainsFunc(st.Problems, func(p string) bool {
			return strings.Contains(p, "hostNetwork pod np/hostpod")
		}), fmt.Sprintf("%+v", st)
	})
	for _, p := range st.Problems {
		if strings.Contains(p, "np/forged") {
			t.Fatalf("a forged lan-address annotation made np/forged a LAN pod: %q", p)
		}
	}
	evs, err := l.kube.Client.CoreV1().Events("np").List(l.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=deny-host"})
	must(t, err, "listing the Events of deny-host")
	for _, e := range evs.Items {
		if strings.Contains(e.Message, "np/forged") {
			t.Fatalf("an Event names np/forged, whose lan-address annotation is forged: %s: %s", e.Reason, e.Message)
		}
	}
}

// turnOff: n's agent restarted with "networkPolicy": false removes the
// policy and pending tables and the files the plugin and status read, and the deny
// policy no longer holds traffic to web.
func (l *npLab) turnOff(n *agentNode, far, web *npPod) {
	t := l.t
	files := []string{table.NamespacesPath(n.runDir, "agt"), controller.StatusPath(n.runDir, "agt")}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("with networkPolicy on: %v", err)
		}
	}
	must(t, n.stop(t, syscall.SIGTERM), "stopping villaged on %s", n.name)
	b, err := os.ReadFile(l.conf)
	must(t, err, "reading the conflist")
	off := strings.Replace(string(b), `"networkPolicy":true`, `"networkPolicy":false`, 1)
	if off == string(b) {
		t.Fatalf("no networkPolicy key to turn off in %s", b)
	}
	must(t, os.WriteFile(l.conf, []byte(off), 0o644), "writing the conflist with networkPolicy off")
	l.start(n)
	waitFor(t, 60*time.Second, "the policy tables and files gone from "+n.name, func() (bool, string) {
		var left []string
		for _, tb := range []string{table.PolicyTable("agt"), table.PendingTable("agt")} {
			if out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.NS.Path()), "nft", "list", "table", "inet", tb).CombinedOutput(); err == nil {
				left = append(left, "table inet "+tb+":\n"+string(out))
			}
		}
		for _, f := range files {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				left = append(left, f)
			}
		}
		return len(left) == 0, strings.Join(left, "\n") + "\n" + n.log.String()
	})
	l.statusLine(n, "network policy: off")
	waitFor(t, 30*time.Second, "far reaching web's port 80 with the policies off", func() (bool, string) {
		err := dialFrom(far.pod.NS, web.ip, 80)
		return err == nil, fmt.Sprint(err)
	})
}

type npLab struct {
	*kubeLab
	ctx context.Context
}

type npPod struct {
	pod  *Pod
	name string
	ip   string
}

func (l *npLab) namespace(name string) {
	_, err := l.kube.Client.CoreV1().Namespaces().Create(l.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	must(l.t, err, "creating namespace %s", name)
	// no kube-controller-manager here to make it
	_, err = l.kube.Client.CoreV1().ServiceAccounts(name).Create(l.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	must(l.t, err, "creating the default ServiceAccount of %s", name)
}

// addK8s is the ADD kubelet makes, with its CNI_ARGS.
func addK8s(t *testing.T, n *agentNode, list *libcni.NetworkConfigList, p *Pod, ns, name string) *current.Result {
	rt := p.rt()
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", name}}
	var res *current.Result
	must(t, n.in(func() error {
		r, err := n.CNI.AddNetworkList(context.Background(), list, rt)
		if err == nil {
			res, err = current.NewResultFromResult(r)
		}
		return err
	}), "ADD %s/%s", ns, name)
	return res
}

// pod makes a pod on n with servers on 80 and 8080 (named "alt"),
// labelled app=name; with publish it also writes its Pod object (else
// publishPod does).
func (l *npLab) pod(n *agentNode, name string, publish bool) *npPod {
	p := n.NewPod()
	for _, port := range []int{80, 8080} {
		testenv.ServeTCP(l.t, p.NS, fmt.Sprintf("[::]:%d", port), "ok")
	}
	r := addK8s(l.t, n, l.list, p, "np", name)
	pp := &npPod{pod: p, name: name, ip: r.IPs[0].Address.IP.String()}
	if publish {
		l.publishPod(n, pp)
	}
	return pp
}

// publishPod writes the Pod object as kubelet would, with its address.
func (l *npLab) publishPod(n *agentNode, p *npPod) {
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: p.name, Labels: map[string]string{"app": p.name}},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{Name: "alt", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}}}
	obj, err := l.kube.Client.CoreV1().Pods("np").Create(l.ctx, obj, metav1.CreateOptions{})
	must(l.t, err, "creating Pod %s", p.name)
	obj.Status.Phase = corev1.PodRunning
	obj.Status.PodIP, obj.Status.PodIPs = p.ip, []corev1.PodIP{{IP: p.ip}}
	_, err = l.kube.Client.CoreV1().Pods("np").UpdateStatus(l.ctx, obj, metav1.UpdateOptions{})
	must(l.t, err, "writing the status of Pod %s", p.name)
}

func (l *npLab) policy(name string, spec networkingv1.NetworkPolicySpec) {
	_, err := l.kube.Client.NetworkingV1().NetworkPolicies("np").Create(l.ctx,
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: name}, Spec: spec}, metav1.CreateOptions{})
	must(l.t, err, "creating NetworkPolicy %s", name)
}

func dialFrom(n ns.NetNS, ip string, port int) error {
	return testenv.Dial(n, ip, port, testenv.DialBound)
}

func (l *npLab) reach(from, to *npPod, port int, want bool) {
	l.t.Helper()
	err := dialFrom(from.pod.NS, to.ip, port)
	switch {
	case want && err != nil:
		l.t.Fatalf("%s -> %s (%s) port %d: want allowed, got %v", from.name, to.name, to.ip, port, err)
	case !want && err == nil:
		l.t.Fatalf("%s -> %s (%s) port %d: want denied, got through", from.name, to.name, to.ip, port)
	case !want && !isTimeout(err):
		l.t.Fatalf("%s -> %s (%s) port %d: want a silent drop, got %v", from.name, to.name, to.ip, port, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// status is node n's `villaged status` output.
func (l *npLab) status(n *agentNode) string {
	out, _ := n.villaged(l.t, "status", "--conf", l.conf, "--node-name", n.name, "--run-dir", n.runDir).CombinedOutput()
	return string(out)
}

func (l *npLab) statusLine(n *agentNode, want string) {
	waitFor(l.t, 30*time.Second, n.name+" status says "+want, func() (bool, string) {
		out := l.status(n)
		return strings.Contains(out, want), out
	})
}

func (l *npLab) waitCompiled(n *agentNode, pods, isolated int) {
	l.statusLine(n, fmt.Sprintf("%d local pods compiled, %d isolated; kernel matches", pods, isolated))
}

func (l *npLab) waitPolicies(n *agentNode, policies int) {
	l.statusLine(n, fmt.Sprintf("network policy: %d policies,", policies))
}

// newPodNeverReachable: while a prober connects from far to the address
// the new pod gets (asked for with CNI_ARGS IP=), the pod is added (its
// servers listen from the start) and only later published; deny-new
// selects it. No probe ever gets through (an answer or a refusal), before
// or after the agent compiled it, while the prober's control (ctl, a
// target far is allowed to reach) answers in every window waited for.
func (l *npLab) newPodNeverReachable(n *agentNode, far *npPod, ctl target) {
	t := l.t
	l.policy("deny-new", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "new"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}})
	l.waitPolicies(n, 3)
	ip := strings.TrimSuffix(n.subnet(t), "0/24") + "200"
	pr := startProber(far.pod.NS, ip, ctl)
	p := n.NewPod()
	for _, port := range []int{80, 8080} {
		testenv.ServeTCP(t, p.NS, fmt.Sprintf("[::]:%d", port), "ok")
	}
	rt := p.rt()
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "np"}, {"K8S_POD_NAME", "new"}, {"IP", ip}}
	must(t, n.in(func() error { _, err := n.CNI.AddNetworkList(context.Background(), l.list, rt); return err }), "ADD new")
	// the window a mark closes: the pod exists, the agent does not know it
	pr.waitTries(t, 2*probeWorkers)
	l.publishPod(n, &npPod{pod: p, name: "new", ip: ip})
	l.waitCompiled(n, 3, 2)
	pr.waitTries(t, 2*probeWorkers)
	tries, through := pr.stop()
	if through != 0 {
		t.Fatalf("%d of %d probes reached the new pod a deny policy selects: %s", through, tries, pr)
	}
	t.Logf("new pod: %s", pr)
	must(t, dialFrom(n.NS, ip, 80), "node -> new pod")
}

// newPodReachable: a new pod of the namespace that no policy selects is
// marked at ADD (the namespace holds policies) and reachable once
// published.
func (l *npLab) newPodReachable(n *agentNode, far *npPod) {
	t := l.t
	p := l.pod(n, "open", false)
	var pending []string
	must(t, testenv.InNS(n.NS, func() error {
		as, err := table.Pending("agt")
		for _, a := range as {
			pending = append(pending, a.String())
		}
		return err
	}), "listing pending")
	if !strings.Contains(strings.Join(pending, ","), p.ip) {
		t.Fatalf("ADD of a pod in a namespace with policies did not mark %s pending: %v", p.ip, pending)
	}
	l.reach(far, p, 80, false)
	l.publishPod(n, p)
	waitFor(t, 30*time.Second, "the published open pod is reachable", func() (bool, string) {
		err := dialFrom(far.pod.NS, p.ip, 80)
		return err == nil, fmt.Sprint(err)
	})
}
