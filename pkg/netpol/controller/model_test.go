package controller

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
)

// TestModelFile: each compile the kernel takes (in a network namespace of
// the test's) leaves the model of it in the run directory, written by the
// controller's model writer, also when the table itself does not change
// (a policy that selects only another node's pod), and rewritten only when
// it changes; Disable removes it.
func TestModelFile(t *testing.T) {
	node := testenv.NewNS(t)
	run := t.TempDir()
	pods, nss, pols := cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc)
	add := func(s cache.Store, o any) {
		t.Helper()
		if err := s.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	add(nss, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "np"}})
	for _, p := range []struct{ name, node, ip string }{{"web", "n1", "10.80.1.2"}, {"far", "n2", "10.80.2.2"}} {
		add(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: p.name, Labels: map[string]string{"app": p.name}},
			Spec: corev1.PodSpec{NodeName: p.node}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: p.ip}}}})
	}
	deny := func(name, app string) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: name},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
	}
	add(pols, deny("deny-web", "web"))
	var logs []string
	c := &ctl{cfg: Config{Network: "mdl", Node: "n1", RunDir: run, Logf: func(f string, a ...any) { logs = append(logs, f) },
		InNS: func(f func() error) error { return testenv.InNS(node, f) }},
		pods: pods, nss: nss, pols: pols, reported: map[table.Problem]bool{}}
	defer c.release()
	stop := c.startModels(context.Background())
	t.Cleanup(func() { _ = testenv.InNS(node, func() error { return table.Remove("mdl") }) })

	c.sync("start")
	if c.failed {
		t.Fatalf("the first apply failed: %v", logs)
	}
	isolated := func(m *netpol.Model) string {
		var out []string
		for _, p := range m.Pods {
			if p.Ingress != nil {
				out = append(out, p.Pod+":"+strings.Join(p.Ingress.Policies, ","))
			}
		}
		return strings.Join(out, " ")
	}
	m := waitModel(t, run, func(m *netpol.Model) bool { return isolated(m) == "np/web:np/deny-web" })
	if m.Network != "mdl" {
		t.Fatalf("model of network %q", m.Network)
	}
	if fi, err := os.Stat(ModelPath(run, "mdl")); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Fatalf("the model file is %v, not root-only (0600)", fi.Mode())
	}
	v, err := netpol.Explain(m, netpol.Endpoint{Pod: "np/far"}, netpol.Endpoint{Pod: "np/web"}, 80, table.ProtoTCP)
	if err != nil || v.Allowed || !strings.Contains(v.Ingress.Reason, "isolated for ingress by np/deny-web") {
		t.Fatalf("far -> web from the file: %+v %v", v, err)
	}

	// the same model again: the file stays as it is (the same inode: not
	// written again); the writer is stopped first, as writeModel is its
	// own
	stop()
	ino := inode(t, run)
	c.writeModel(c.input())
	if inode(t, run) != ino {
		t.Fatal("the same model was written again")
	}
	defer c.startModels(context.Background())()

	// a policy for the other node's pod: the same table, a new model
	add(pols, deny("deny-far", "far"))
	last := c.last
	c.sync("change")
	if !table.Equal(c.last, last) {
		t.Fatal("a policy on another node's pod changed this node's table")
	}
	waitModel(t, run, func(m *netpol.Model) bool { return isolated(m) == "np/far:np/deny-far np/web:np/deny-web" })

	// policy off: the file goes with the rest
	if err := testenv.InNS(node, func() error { return Disable(run, "mdl") }); err != nil {
		t.Fatal(err)
	}
	if m, err := ReadModel(run, "mdl"); m != nil || err != nil {
		t.Fatalf("after Disable: model %v, %v", m, err)
	}
}

// waitModel waits for the model file to be one that ok accepts.
func waitModel(t *testing.T, run string, ok func(*netpol.Model) bool) *netpol.Model {
	t.Helper()
	var m *netpol.Model
	testenv.WaitFor(t, "the model file", func() error {
		var err error
		if m, err = ReadModel(run, "mdl"); err != nil {
			t.Fatalf("reading the model file: %v", err)
		}
		if m == nil || !ok(m) {
			return fmt.Errorf("the model file is still %+v", m)
		}
		return nil
	})
	return m
}

func inode(t *testing.T, run string) uint64 {
	t.Helper()
	fi, err := os.Stat(ModelPath(run, "mdl"))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
