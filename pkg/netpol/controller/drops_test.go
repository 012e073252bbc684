package controller

import (
	"net/netip"
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/drops"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// TestModelNamesDrops: each model the controller writes reaches
// Config.Model, which is how the drops recorder names addresses and the
// isolating policies; Disable removes the drops file.
func TestModelNamesDrops(t *testing.T) {
	node := testenv.NewNS(t)
	run := t.TempDir()
	pods, nss, pols := cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, o := range []any{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "np"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: "web", Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.81.1.2"}}}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "np", Name: "deny-web"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
	} {
		var s cache.Store
		switch o.(type) {
		case *corev1.Namespace:
			s = nss
		case *corev1.Pod:
			s = pods
		default:
			s = pols
		}
		if err := s.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	rec := drops.NewRecorder("drp", 0)
	c := &ctl{cfg: Config{Network: "drp", Node: "n1", RunDir: run, Logf: t.Logf, Model: rec.SetModel,
		InNS: func(f func() error) error { return testenv.InNS(node, f) }},
		pods: pods, nss: nss, pols: pols, reported: map[table.Problem]bool{}}
	defer c.release()
	t.Cleanup(func() { _ = testenv.InNS(node, func() error { return table.Remove("drp") }) })
	c.sync("start")
	if c.failed {
		t.Fatal("the first apply failed")
	}
	names := rec.Names()
	if pod := names.Pod(netip.MustParseAddr("10.81.1.2")); pod != "np/web" {
		t.Errorf("10.81.1.2 named %q, want np/web", pod)
	}
	if pols := names.Isolating("np/web", "ingress"); !slices.Equal(pols, []string{"np/deny-web"}) {
		t.Errorf("np/web isolated for ingress by %v, want [np/deny-web]", pols)
	}
	if pod := names.PodOfChain(table.ChainName("ingress", "np/web")); pod != "np/web" {
		t.Errorf("chain of np/web's ingress names %q", pod)
	}
	path := nodelocal.PolicyDrops(run, "drp")
	if err := nodelocal.WriteFile(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := testenv.InNS(node, func() error { return Disable(run, "drp") }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the drops file after Disable: %v", err)
	}
}
