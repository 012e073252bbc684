package kube_test

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/pkg/buildinfo"
)

// checkLifecycle: the agent pod deleted and recreated, a kubelet restarted
// under running pods, a rolling update of the DaemonSet under held
// connections, and a node joining the running cluster.
func checkLifecycle(t *testing.T, c *kubecluster.Cluster) {
	f := newFixture(t, c, "life")
	n1 := node(t, c, "node-1")
	f.server("a1", "node-1")
	f.server("b2", "node-2")
	pods := f.running("a1", "b2")
	connected := func(t *testing.T) {
		t.Helper()
		expect(t, "a1 (node-1) -> b2 (node-2)", "b2", f.tcpFromPod("a1", pods["b2"].Status.PodIP, 8080))
		expect(t, "b2 (node-2) -> a1 (node-1)", "a1", f.tcpFromPod("b2", pods["a1"].Status.PodIP, 8080))
	}

	t.Run("AgentRecreated", func(t *testing.T) {
		old := villagePods(t, c)[n1.Name]
		if err := c.Client().CoreV1().Pods(kubecluster.VillageNamespace).Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := kubecluster.Poll(wait, func() error {
			p, ok := villagePods(t, c)[n1.Name]
			if !ok || p.UID == old.UID || !podReady(&p) {
				return fmt.Errorf("no new Ready Village pod on %s yet", n1.Name)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitVillageReady(wait); err != nil {
			t.Fatal(err)
		}
		connected(t)
		f.server("a1new", n1.Name)
		p := f.running("a1new")["a1new"]
		expect(t, "b2 -> a1new (started after the agent came back)", "a1new", f.tcpFromPod("b2", p.Status.PodIP, 8080))
	})

	t.Run("KubeletRestart", func(t *testing.T) {
		before := f.running("a1")["a1"]
		if err := n1.RestartKubelet(); err != nil {
			t.Fatal(err)
		}
		after := f.running("a1")["a1"]
		if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
			t.Errorf("a1 after kubelet restart: UID %s IP %s, before UID %s IP %s", after.UID, after.Status.PodIP, before.UID, before.Status.PodIP)
		}
		if a, b := after.Status.ContainerStatuses[0], before.Status.ContainerStatuses[0]; a.ContainerID != b.ContainerID || a.RestartCount != 0 {
			t.Errorf("a1's container changed over the kubelet restart: %s (restarts %d), before %s", a.ContainerID, a.RestartCount, b.ContainerID)
		}
		connected(t)
	})

	t.Run("RollingUpdate", func(t *testing.T) {
		f.create(podSpec("echo", "node-2", corev1.RestartPolicyAlways, "-echo", ":9000"))
		echo := f.running("echo")["echo"].Status.PodIP
		target := echo + ":9000"
		// Clients that exit 1 the moment their connection breaks (and are
		// never restarted): one across nodes, one on the echo's node.
		f.create(podSpec("hold-cross", "node-1", corev1.RestartPolicyNever, "-dial", target))
		f.create(podSpec("hold-same", "node-2", corev1.RestartPolicyNever, "-dial", target))
		f.running("hold-cross", "hold-same")
		for _, h := range []string{"hold-cross", "hold-same"} {
			waitLog(t, c, f.ns, h, func(log string) bool { return lastOK(log) > 0 })
		}
		addrs := podAddresses(t, f)

		newImage := buildinfo.Image + "-rollout"
		archive := filepath.Join(t.TempDir(), "village-rollout.tar")
		if err := kubecluster.BuildVillageImage(t, archive, newImage); err != nil {
			t.Fatal(err)
		}
		if err := c.ImportImage(archive); err != nil {
			t.Fatal(err)
		}
		if out, err := c.Kubectl("-n", kubecluster.VillageNamespace, "set", "image", "daemonset/"+kubecluster.VillageDaemonSet,
			"install="+newImage, "agent="+newImage); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if err := kubecluster.Poll(wait, func() error {
			for n, p := range villagePods(t, c) {
				for _, ct := range p.Spec.Containers {
					if ct.Image != newImage || !podReady(&p) {
						return fmt.Errorf("Village pod %s on %s: %s, ready %v", p.Name, n, ct.Image, podReady(&p))
					}
				}
			}
			return c.WaitVillageReady(0)
		}); err != nil {
			t.Fatalf("rollout to %s: %v", newImage, err)
		}
		// The connections carried on after the rollout: each client's count
		// moves past where it stood when the last agent was Ready.
		for _, h := range []string{"hold-cross", "hold-same"} {
			base := lastOK(logs(t, c, f.ns, h))
			waitLog(t, c, f.ns, h, func(log string) bool { return lastOK(log) > base || strings.Contains(log, "broken") })
			log := logs(t, c, f.ns, h)
			if strings.Contains(log, "broken") {
				t.Errorf("%s lost its connection to %s during the rollout:\n%s", h, target, log)
			}
			p, err := c.Client().CoreV1().Pods(f.ns).Get(context.Background(), h, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				t.Errorf("%s after the rollout: %v %v", h, p.Status.Phase, err)
			}
		}
		if after := podAddresses(t, f); fmt.Sprint(after) != fmt.Sprint(addrs) {
			t.Errorf("pod addresses changed over the rollout:\nbefore %v\nafter  %v", addrs, after)
		}
		connected(t)
	})

	t.Run("NodeJoins", func(t *testing.T) {
		// Pods waiting for node-3 before it exists: the scheduler binds
		// them the moment the node turns Ready, the window in which a node
		// that reports network-ready too early fails their sandboxes.
		joiners := []string{"j1", "j2", "j3"}
		for _, j := range joiners {
			f.server(j, "node-3")
		}
		n3 := c.AddNode(t)
		js := f.running(joiners...)
		expect(t, "j1 (node-3) -> a1 (node-1)", "a1", f.tcpFromPod("j1", pods["a1"].Status.PodIP, 8080))
		expect(t, "a1 (node-1) -> j1 (node-3)", "j1", f.tcpFromPod("a1", js["j1"].Status.PodIP, 8080))
		ev, err := c.Client().CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FailedCreatePodSandBox"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, "j") {
				t.Errorf("pod %s scheduled onto joining %s failed a sandbox (%d times): %s", e.InvolvedObject.Name, n3.Name, e.Count, e.Message)
			}
		}
	})

	t.Run("Reboot", func(t *testing.T) { checkReboot(t, c, f) }) // reboot_test.go
}

var okLine = regexp.MustCompile(`(?m)^ok (\d+)$`)

// lastOK is the last "ok N" count a hold client printed (0: none yet).
func lastOK(log string) int {
	m := okLine.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

func logs(t *testing.T, c *kubecluster.Cluster, namespace, pod string) string {
	t.Helper()
	out, err := c.Kubectl("-n", namespace, "logs", pod)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func waitLog(t *testing.T, c *kubecluster.Cluster, namespace, pod string, ok func(string) bool) {
	t.Helper()
	var log string
	if err := kubecluster.Poll(wait, func() error {
		out, err := c.Kubectl("-n", namespace, "logs", pod)
		if err != nil {
			return err
		}
		if log = string(out); !ok(log) {
			return fmt.Errorf("log so far: %q", log)
		}
		return nil
	}); err != nil {
		t.Fatalf("%s/%s: %v", namespace, pod, err)
	}
}

// podAddresses maps every pod of the fixture (name/UID) to its address.
func podAddresses(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	list, err := f.c.Client().CoreV1().Pods(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, p := range list.Items {
		m[p.Name+"/"+string(p.UID)] = p.Status.PodIP
	}
	return m
}
