// Package kube_test runs Village on a real Kubernetes cluster
// (internal/kubecluster): pods through the API, Services through
// kube-proxy in iptables and nftables mode, Village installed from
// deploy/kubernetes, and the lifecycle of its DaemonSet and nodes.
package kube_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/internal/crienv"
	"github.com/village-cni/village/internal/kubecluster"
)

// wait is the generous bound of every condition the tests wait for.
const wait = 3 * time.Minute

// fixture is one test namespace of a cluster.
type fixture struct {
	t  testing.TB
	c  *kubecluster.Cluster
	ns string
}

func newFixture(t testing.TB, c *kubecluster.Cluster, name string) *fixture {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	if err := kubecluster.Poll(wait, func() error {
		_, err := c.Client().CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatalf("service account default in %s: %v", name, err)
	}
	return &fixture{t: t, c: c, ns: name}
}

// podSpec is a pod of the tools image on node running /pause with args,
// labelled app=name.
func podSpec(name, node string, restart corev1.RestartPolicy, args ...string) *corev1.Pod {
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			RestartPolicy:                 restart,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: crienv.ToolsImage, ImagePullPolicy: corev1.PullNever,
				Command: append([]string{"/pause"}, args...),
			}},
		},
	}
}

// server starts a pod on node answering every TCP connection on 8080 with
// its name.
func (f *fixture) server(name, node string) {
	f.t.Helper()
	f.create(podSpec(name, node, corev1.RestartPolicyAlways, "-listen", ":8080", "-reply", name))
}

func (f *fixture) create(p *corev1.Pod) {
	f.t.Helper()
	if _, err := f.c.Client().CoreV1().Pods(f.ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("pod %s: %v", p.Name, err)
	}
}

// running waits until the pods run (all containers ready) and returns them.
func (f *fixture) running(names ...string) map[string]*corev1.Pod {
	f.t.Helper()
	pods := map[string]*corev1.Pod{}
	for _, name := range names {
		err := kubecluster.Poll(wait, func() error {
			p, err := f.c.Client().CoreV1().Pods(f.ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || !podReady(p) {
				return fmt.Errorf("pod %s: phase %s, IP %q, conditions %v", name, p.Status.Phase, p.Status.PodIP, p.Status.Conditions)
			}
			pods[name] = p
			return nil
		})
		if err != nil {
			f.t.Fatal(err)
		}
	}
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// service makes a Service on port 80 to the pods labelled app=target's
// 8080 and returns it (its ClusterIP and, for NodePort, the node port).
func (f *fixture) service(name, target string, typ corev1.ServiceType) *corev1.Service {
	f.t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": target},
			Ports:    []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	s, err := f.c.Client().CoreV1().Services(f.ns).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("service %s: %v", name, err)
	}
	return s
}

// exec runs a command in a pod through the API server and the kubelet
// (kubectl exec inside the LAN namespace).
func (f *fixture) exec(pod string, cmd ...string) (string, error) {
	out, err := f.c.Kubectl(append([]string{"-n", f.ns, "exec", pod, "--"}, cmd...)...)
	return string(out), err
}

// expect waits until get returns want (after trimming), for the
// connection a Service's rules or a route still being programmed.
func expect(t *testing.T, what, want string, get func() (string, error)) {
	t.Helper()
	var got string
	err := kubecluster.Poll(wait, func() error {
		var err error
		got, err = get()
		got = strings.TrimSpace(got)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("got %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: want %q: %v", what, want, err)
	}
}

// tcpFromPod connects from pod to ip:port with busybox nc and returns what
// the server wrote.
func (f *fixture) tcpFromPod(pod, ip string, port int) func() (string, error) {
	return func() (string, error) {
		return f.exec(pod, "nc", "-w", "5", ip, strconv.Itoa(port))
	}
}

// dialIn connects from inside n to addr and returns what the server wrote
// until it closed the connection.
func dialIn(n ns.NetNS, addr string) func() (string, error) {
	return func() (string, error) {
		var conn net.Conn
		err := n.Do(func(ns.NetNS) error {
			var err error
			conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
			return err
		})
		if err != nil {
			return "", err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(conn)
		return string(b), err
	}
}

// sourceServer listens on addr inside n and answers every connection with
// the address it came from (what the server side sees after any NAT).
func sourceServer(t *testing.T, n ns.NetNS, addr string) {
	t.Helper()
	var l net.Listener
	if err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
			fmt.Fprintln(conn, host)
			conn.Close()
		}
	}()
}

// node returns the cluster's node by name.
func node(t testing.TB, c *kubecluster.Cluster, name string) *kubecluster.Node {
	t.Helper()
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return nil
}

// ipamHolds reports whether the node's village-ipam store (host-local's
// format: one file per address) holds ip.
func ipamHolds(n *kubecluster.Node, ip string) (bool, error) {
	out, err := n.Exec("ls", "-1", "/var/lib/cni/networks/village")
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == ip {
			return true, nil
		}
	}
	return false, nil
}

// villagePods lists the DaemonSet's pods by node name.
func villagePods(t *testing.T, c *kubecluster.Cluster) map[string]corev1.Pod {
	t.Helper()
	list, err := c.Client().CoreV1().Pods(kubecluster.VillageNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: kubecluster.VillageSelector})
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			byNode[p.Spec.NodeName] = p
		}
	}
	return byNode
}
