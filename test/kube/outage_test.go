package kube_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
)

// apiFreeze is how long checkAPIServerFrozen keeps the API server stopped
// (issue 38: "for a minute").
const apiFreeze = time.Minute

// checkAPIServerFrozen: kube-apiserver is stopped with SIGSTOP for a minute
// (sockets open, nothing answering: a hung control plane; SIGCONT in a
// cleanup even when the test fails). A prober pod on each node connects
// every 0.5 s to a server pod on the other node, by its address and through
// its ClusterIP Service, and prints each answer; the log (timestamped by
// the runtime, read after the thaw) shows every probe made during the
// freeze answered. After SIGCONT the cluster recovers by itself: a new pod
// on each node comes up and reaches the other node's, and the Village
// agents run on in the same containers (no restart) and are Ready.
func checkAPIServerFrozen(t *testing.T, c *kubecluster.Cluster) {
	ctx := context.Background()
	f := newFixture(t, c, "freeze")
	f.server("fz-s1", "node-1")
	f.server("fz-s2", "node-2")
	svc1 := f.service("fz-svc1", "fz-s1", corev1.ServiceTypeClusterIP)
	svc2 := f.service("fz-svc2", "fz-s2", corev1.ServiceTypeClusterIP)
	srv := f.running("fz-s1", "fz-s2")
	// fz-p1 on node-1 probes node-2's server, fz-p2 the other way.
	probers := map[string]struct{ pod, svc, want string }{
		"fz-p1": {srv["fz-s2"].Status.PodIP, svc2.Spec.ClusterIP, "fz-s2"},
		"fz-p2": {srv["fz-s1"].Status.PodIP, svc1.Spec.ClusterIP, "fz-s1"},
	}
	for name, p := range probers {
		script := fmt.Sprintf(`while :; do echo "pod $(nc -w 2 %s 8080 </dev/null)"; echo "svc $(nc -w 2 %s 80 </dev/null)"; sleep 0.5; done`, p.pod, p.svc)
		spec := podSpec(name, "node-"+name[len(name)-1:], corev1.RestartPolicyAlways)
		spec.Spec.Containers[0].Command = []string{"sh", "-c", script}
		f.create(spec)
	}
	f.running("fz-p1", "fz-p2")
	for name, p := range probers {
		waitLog(t, c, f.ns, name, func(log string) bool {
			return strings.Contains(log, "pod "+p.want) && strings.Contains(log, "svc "+p.want)
		})
	}
	agents := villagePods(t, c)

	thaw, err := c.API().FreezeAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(thaw)
	frozen := time.Now()
	time.Sleep(apiFreeze) // the outage itself: the one wait on the clock
	thaw()
	thawed := time.Now()

	// Recovery: the API answers, a new pod on each node comes up and
	// reaches the other's.
	if err := kubecluster.Poll(wait, func() error {
		_, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err
	}); err != nil {
		t.Fatalf("the API server after SIGCONT: %v", err)
	}
	apiBack := time.Since(thawed)
	f.server("fz-n1", "node-1")
	f.server("fz-n2", "node-2")
	fresh := f.running("fz-n1", "fz-n2")
	expect(t, "fz-n1 (node-1, new after the freeze) -> fz-n2 (node-2)", "fz-n2", f.tcpFromPod("fz-n1", fresh["fz-n2"].Status.PodIP, 8080))
	expect(t, "fz-n2 (node-2, new after the freeze) -> fz-n1 (node-1)", "fz-n1", f.tcpFromPod("fz-n2", fresh["fz-n1"].Status.PodIP, 8080))
	expect(t, "fz-n1 -> fz-svc2 after the freeze", "fz-s2", f.tcpFromPod("fz-n1", svc2.Spec.ClusterIP, 80))
	if err := c.WaitVillageReady(wait); err != nil {
		t.Fatal(err)
	}
	recovered := time.Since(thawed)
	t.Logf("FIGURE: kube-apiserver frozen for %s; after SIGCONT the API answered in %s, and %s after SIGCONT new pods on both nodes reached each other and every Village pod was Ready",
		thawed.Sub(frozen).Round(time.Millisecond), apiBack.Round(time.Millisecond), recovered.Round(time.Millisecond))

	// The probes made while the API server was frozen were all answered.
	for name, p := range probers {
		out, err := c.Kubectl("-n", f.ns, "logs", "--timestamps", name)
		if err != nil {
			t.Fatalf("logs of %s: %v\n%s", name, err, out)
		}
		counts := map[string][2]int{} // "pod"/"svc": sent, answered
		for _, line := range strings.Split(string(out), "\n") {
			ts, rest, ok := strings.Cut(line, " ")
			at, err := time.Parse(time.RFC3339Nano, ts)
			if !ok || err != nil || at.Before(frozen) || at.After(thawed) {
				continue
			}
			kind, answer, _ := strings.Cut(rest, " ")
			n := counts[kind]
			n[0]++
			if answer == p.want {
				n[1]++
			}
			counts[kind] = n
		}
		for _, kind := range []string{"pod", "svc"} {
			n := counts[kind]
			t.Logf("FIGURE: during the API server freeze, %s -> %s by %s address: %d connections, %d answered", name, p.want, kind, n[0], n[1])
			if n[0] == 0 || n[1] != n[0] {
				t.Errorf("%s -> %s by %s address during the freeze: %d of %d connections answered", name, p.want, kind, n[1], n[0])
			}
		}
	}

	// The agents ran through it: the same pods, the same containers, no
	// restart.
	for nodeName, after := range villagePods(t, c) {
		before, ok := agents[nodeName]
		if !ok {
			continue
		}
		if after.UID != before.UID {
			t.Errorf("the Village pod on %s was replaced over the freeze: %s -> %s", nodeName, before.Name, after.Name)
			continue
		}
		for i, st := range after.Status.ContainerStatuses {
			was := before.Status.ContainerStatuses[i]
			if st.RestartCount != was.RestartCount || st.ContainerID != was.ContainerID {
				t.Errorf("Village container %s on %s restarted over the freeze (restarts %d -> %d; last state %+v)",
					st.Name, nodeName, was.RestartCount, st.RestartCount, st.LastTerminationState.Terminated)
			}
		}
		if !podReady(&after) {
			t.Errorf("the Village pod on %s is not Ready after the freeze: %v", nodeName, after.Status.Conditions)
		}
		for _, cond := range after.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.LastTransitionTime.After(frozen) {
				t.Logf("the Village pod on %s turned Ready again at %s, %s after SIGCONT", nodeName,
					cond.LastTransitionTime.Format(time.RFC3339), cond.LastTransitionTime.Sub(thawed).Round(time.Second))
			}
		}
	}
}
