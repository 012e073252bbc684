package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/internal/testenv"
)

// whyCase is one question to `villaged why` on a node, and the real
// connection that answers it.
type whyCase struct {
	from, to *npPod
	// fromArg and toArg are what why is given: namespace/pod or the
	// address
	fromArg, toArg string
	port           int
	// says is a text of why's output for this case
	says string
}

// why runs on TestNetworkPolicyAgents' lab, where web (on n) is isolated
// by deny-web and opened to far on its named port "alt" (8080) by
// far-to-web: a namespace labelled team=blue gets a pod on another node
// (blue) and a policy admits that namespace to web's port 80. For an
// allow, a deny, a port rule and the namespace selector, n's `villaged
// why` (the built binary, exit 0 allowed, 1 denied) says what a real TCP
// connection between the pods does, and names the deciding policy and
// rule; then again with the API server frozen (SIGSTOP), since why reads
// only what the node compiled. It leaves the lab as it found it but for
// the blue namespace and its pod (another node's, so n's counts stay).
func (l *npLab) why(n, other *agentNode, far, web, local *npPod) {
	t := l.t
	_, err := l.kube.Client.CoreV1().Namespaces().Create(l.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "blue",
		Labels: map[string]string{"team": "blue"}}}, metav1.CreateOptions{})
	must(t, err, "creating namespace blue")
	_, err = l.kube.Client.CoreV1().ServiceAccounts("blue").Create(l.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	must(t, err, "creating the default ServiceAccount of blue")
	blue := l.podIn(other, "blue", "blue")
	testenv.ServeTCP(t, blue.pod.NS, "[::]:8080", "ok") // podIn serves 80 only
	l.publishIn(other, "blue", blue)
	port80 := intstr.FromInt32(80)
	l.policy("from-blue", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port80}}}}})
	l.waitPolicies(n, 3)
	l.statusLine(n, "kernel matches")

	cases := []whyCase{
		{far, web, "np/far", "np/web", 8080, `allowed by np/far-to-web spec.ingress[0].from[0] port 8080/TCP (named port "alt" of pod np/web)`},
		{local, web, local.ip, "np/web", 8080, "denied: pod np/web is isolated for ingress by np/deny-web, np/far-to-web, np/from-blue and no rule admits " + local.ip + " to 8080/TCP"},
		{far, web, "np/far", web.ip, 80, "no rule admits " + far.ip + ` to 80/TCP; np/far-to-web spec.ingress[0].from[0] names port "alt", which is 8080/TCP on pod np/web, not 80`},
		{blue, web, "blue/blue", "np/web", 80, "allowed by np/from-blue spec.ingress[0].from[0] port 80/TCP"},
		{blue, web, "blue/blue", "np/web", 8080, "no rule admits " + blue.ip + " to 8080/TCP"},
	}
	// the model is written once the compile of blue's pod is in the kernel
	waitFor(t, 60*time.Second, n.name+"'s why knows blue/blue", func() (bool, string) {
		_, out := l.askWhy(n, cases[3])
		return strings.Contains(out, cases[3].says), out
	})
	l.whyAgrees(n, cases, "")

	thaw, err := l.kube.FreezeAPIServer()
	must(t, err, "freezing the API server")
	t.Cleanup(thaw)
	ctx, cancel := context.WithTimeout(l.ctx, 3*time.Second)
	_, err = l.kube.Client.CoreV1().Namespaces().Get(ctx, "blue", metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("the frozen API server answered")
	}
	l.whyAgrees(n, cases, " (API server frozen)")
	thaw()

	must(t, l.kube.Client.NetworkingV1().NetworkPolicies("np").Delete(l.ctx, "from-blue", metav1.DeleteOptions{}), "deleting from-blue")
	l.waitPolicies(n, 2)
	l.statusLine(n, "kernel matches")
}

// askWhy is n's `villaged why` for c: its exit status and output.
func (l *npLab) askWhy(n *agentNode, c whyCase) (int, string) {
	out, err := n.villaged(l.t, "why", "--conf", l.conf, "--node-name", n.name, "--run-dir", n.runDir,
		c.fromArg, c.toArg, strconv.Itoa(c.port)).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	l.t.Fatalf("running villaged why: %v: %s", err, out)
	return -1, ""
}

// whyAgrees: for each case, why's verdict is the real connection's
// (connected: exit 0; unanswered: exit 1) and why says c.says.
func (l *npLab) whyAgrees(n *agentNode, cases []whyCase, when string) {
	t := l.t
	for _, c := range cases {
		code, out := l.askWhy(n, c)
		err := dialFrom(c.from.pod.NS, c.to.ip, c.port)
		what := fmt.Sprintf("%s -> %s port %d%s", c.fromArg, c.toArg, c.port, when)
		t.Logf("villaged why %s %s %d%s: exit %d\n%s", c.fromArg, c.toArg, c.port, when, code, out)
		switch {
		case err == nil && code != 0:
			t.Fatalf("%s: the connection got through, why exits %d:\n%s", what, code, out)
		case err != nil && !isTimeout(err):
			t.Fatalf("%s: the connection failed otherwise than unanswered: %v", what, err)
		case err != nil && code != 1:
			t.Fatalf("%s: the connection went unanswered (%v), why exits %d:\n%s", what, err, code, out)
		}
		if !strings.Contains(out, c.says) {
			t.Fatalf("%s: why does not say %q:\n%s", what, c.says, out)
		}
	}
}
