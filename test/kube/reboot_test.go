package kube_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/pkg/village"
)

// checkReboot: node-1 is power-cycled (kubecluster.Node.Reboot: every
// process killed, its /run and its kernel network state gone, its disk
// with the conflist kept) under a pod that a deny-all-ingress
// NetworkPolicy selects and a control pod nothing selects. From before the
// reboot until well after the node is back, a prober in the LAN namespace
// (where the cluster routes the pod subnets) connects every 0.2 s to the
// deny pod's current address (read from the API each time): no probe may
// be answered, neither by a
// connection nor by a refusal (only the pod's own stack answers either).
// The control pod answers once back, and no FailedCreatePodSandBox Event
// from Village (its CNI error's marker, village.ParseError) is recorded
// after the reboot. TestLANPods runs it too, with the home lab's LAN
// section (pods "annotated": every ADD asks the agent first). It logs the time to Ready
// and the probes sent.
func checkReboot(t *testing.T, c *kubecluster.Cluster, f *fixture) {
	rebootCheck(t, c, f, nil)
}

// checkRebootLAN is checkReboot on a cluster with the home lab's LAN
// section (pods "annotated", TestLANPods), whose ConfigMap has no
// NetworkPolicy: no deny pod and no prober, and beside the control pod an
// annotated LAN pod (rb-lan) on node-1. Every ADD after the reboot asks the
// agent first, which is not back yet: they wait for it (agentsock's
// AskWaiting, within nodelocal.AgentWait) instead of failing, so no
// FailedCreatePodSandBox Event of Village's is recorded, and rb-lan gets its
// LAN interface again.
func checkRebootLAN(t *testing.T, c *kubecluster.Cluster, f *fixture, lanPod func(f *fixture, name, nodeName string)) {
	rebootCheck(t, c, f, lanPod)
}

// rebootCheck is checkReboot, or with lanPod checkRebootLAN.
func rebootCheck(t *testing.T, c *kubecluster.Cluster, f *fixture, lanPod func(f *fixture, name, nodeName string)) {
	ctx := context.Background()
	n1 := node(t, c, "node-1")
	if lanPod != nil {
		f.server("rb-open", n1.Name)
		lanPod(f, "rb-lan", n1.Name)
		before := f.running("rb-open", "rb-lan")
		start, _, _ := rebootNode(t, c, n1)
		after := restarted(t, f, before, "rb-open", "rb-lan")
		expect(t, "LAN -> rb-open after the reboot", "rb-open", dialIn(c.LAN(), net.JoinHostPort(after["rb-open"].Status.PodIP, "8080")))
		if out, err := f.exec("rb-lan", "ip", "-o", "addr", "show", "net1"); err != nil || !strings.Contains(out, kubecluster.LANPrefix) {
			t.Errorf("rb-lan after the reboot: net1 %q (%v), want a LAN address", out, err)
		}
		noVillageSandboxFailure(t, c, start)
		t.Logf("reboot of %s with a LAN section: both pods running again after %s", n1.Name, time.Since(start).Round(100*time.Millisecond))
		return
	}
	_, err := c.Client().NetworkingV1().NetworkPolicies(f.ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "rb-deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "rb-deny"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.server("rb-deny", n1.Name)
	f.server("rb-open", n1.Name)
	before := f.running("rb-deny", "rb-open")
	expect(t, "LAN -> rb-open before the reboot", "rb-open", dialIn(c.LAN(), net.JoinHostPort(before["rb-open"].Status.PodIP, "8080")))
	if err := kubecluster.Poll(wait, func() error {
		if answered(c.LAN(), before["rb-deny"].Status.PodIP) {
			return errors.New("rb-deny still answers the LAN")
		}
		return nil
	}); err != nil {
		t.Fatalf("the policy before the reboot: %v", err)
	}

	pr := startRebootProber(c, f.ns, "rb-deny")
	t.Cleanup(func() { pr.stop() })
	pr.waitSent(t, 10)
	start, booted, ready := rebootNode(t, c, n1)
	after := restarted(t, f, before, "rb-deny", "rb-open")
	podsBack := time.Since(start)
	expect(t, "LAN -> rb-open after the reboot", "rb-open", dialIn(c.LAN(), net.JoinHostPort(after["rb-open"].Status.PodIP, "8080")))
	pr.waitSent(t, 25) // the deny pod running again, compiled or not
	sent, got, last := pr.stop()
	if got != 0 {
		t.Errorf("%d of %d probes to rb-deny were answered over the reboot (last: %s)", got, sent, last)
	}
	noVillageSandboxFailure(t, c, start)
	t.Logf("reboot of %s: kubelet up after %s, Ready after %s, both pods running again after %s; rb-deny's address %s -> %s; %d probes sent every 0.2 s, %d answered",
		n1.Name, booted.Round(100*time.Millisecond), ready.Round(100*time.Millisecond), podsBack.Round(100*time.Millisecond),
		before["rb-deny"].Status.PodIP, after["rb-deny"].Status.PodIP, sent, got)
}

// rebootNode power-cycles n and waits until its new kubelet posted Ready
// (the Node object says Ready from before until then) and the Village
// DaemonSet is ready again; it returns the reboot's start and how long the
// kubelet took to come up and to post Ready.
func rebootNode(t *testing.T, c *kubecluster.Cluster, n *kubecluster.Node) (start time.Time, booted, ready time.Duration) {
	t.Helper()
	start = time.Now()
	if err := n.Reboot(); err != nil {
		t.Fatal(err)
	}
	booted = time.Since(start)
	if err := kubecluster.Poll(wait, func() error {
		obj, err := c.Client().CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range obj.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(start.Truncate(time.Second)) {
				ready = time.Since(start)
				return nil
			}
		}
		return fmt.Errorf("node %s: no Ready condition posted since the reboot: %v", n.Name, obj.Status.Conditions)
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitVillageReady(wait); err != nil {
		t.Fatal(err)
	}
	return start, booted, ready
}

// noVillageSandboxFailure fails t for each FailedCreatePodSandBox Event
// since start whose message carries Village's CNI error marker.
func noVillageSandboxFailure(t *testing.T, c *kubecluster.Cluster, start time.Time) {
	t.Helper()
	ev, err := c.Client().CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=FailedCreatePodSandBox"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ev.Items {
		when := e.LastTimestamp.Time
		if e.EventTime.Time.After(when) {
			when = e.EventTime.Time
		}
		// Village's sandbox failures are told by the marker its CNI error
		// carries (plugin name and code), not by the message's wording.
		if m, ok := village.ParseError(e.Message); ok && m.Plugin == village.Plugin && !when.Before(start.Truncate(time.Second)) {
			t.Errorf("after the reboot: FailedCreatePodSandBox by %s (CNI code %d) for %s/%s (%d times): %s", m.Plugin, m.Code, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Count, e.Message)
		}
	}
}

// restarted waits until each named pod runs again in a sandbox made after
// the reboot (its container ID differs from before's) and returns them.
func restarted(t *testing.T, f *fixture, before map[string]*corev1.Pod, names ...string) map[string]*corev1.Pod {
	t.Helper()
	out := map[string]*corev1.Pod{}
	for _, name := range names {
		old := before[name].Status.ContainerStatuses[0].ContainerID
		if err := kubecluster.Poll(wait, func() error {
			p, err := f.c.Client().CoreV1().Pods(f.ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ContainerID == old || !podReady(p) || p.Status.PodIP == "" {
				return fmt.Errorf("pod %s not running again since the reboot: %v", name, p.Status.ContainerStatuses)
			}
			out[name] = p
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// answered reports whether a connection from n to ip:8080 got any answer
// from the pod: accepted, or refused (a reset: the pod's stack without a
// listener yet). A drop times out; an ICMP error of a node that has no
// route or neighbour for the address is no answer of the pod's.
func answered(n ns.NetNS, ip string) bool {
	var err error
	_ = n.Do(func(ns.NetNS) error {
		var conn net.Conn
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), time.Second)
		if err == nil {
			conn.Close()
		}
		return nil
	})
	return err == nil || errors.Is(err, syscall.ECONNREFUSED)
}

// rebootProber probes a pod's current address every 0.2 s.
type rebootProber struct {
	sent, got atomic.Int64
	last      atomic.Value // string: the last answered probe
	done      chan struct{}
	once      sync.Once
	wg        sync.WaitGroup
}

func startRebootProber(c *kubecluster.Cluster, namespace, pod string) *rebootProber {
	p := &rebootProber{done: make(chan struct{})}
	p.wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			obj, err := c.Client().CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
			cancel()
			if err != nil || obj.Status.PodIP == "" {
				continue
			}
			ip := obj.Status.PodIP
			p.wg.Go(func() {
				p.sent.Add(1)
				if answered(c.LAN(), ip) {
					p.got.Add(1)
					p.last.Store(fmt.Sprintf("%s at %s", ip, time.Now().Format(time.RFC3339Nano)))
				}
			})
		}
	})
	return p
}

// waitSent waits for n more probes.
func (p *rebootProber) waitSent(t *testing.T, n int64) {
	t.Helper()
	from := p.sent.Load()
	if err := kubecluster.Poll(wait, func() error {
		if s := p.sent.Load(); s < from+n {
			return fmt.Errorf("%d probes sent", s-from)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func (p *rebootProber) stop() (sent, got int64, last string) {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
	last, _ = p.last.Load().(string)
	return p.sent.Load(), p.got.Load(), last
}
