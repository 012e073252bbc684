package lanpods

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/kubenames"
)

// TestControllerOverSharedInformers runs the controller as the agent does
// with NetworkPolicy on (a cluster-wide Pod informer of a shared factory,
// the agent's one recorder) against a real kube-apiserver: a pod's
// annotations are answered, a namespace without the label is refused with
// an Event on the pod, a bad annotation too, a pod created after the
// informers synced is found (a direct read), the report writes the
// lan-address annotation, and the listing holds only this node's pods
// although the cache holds every node's.
func TestControllerOverSharedInformers(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	cs := kube.Client
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mk := func(obj any) {
		t.Helper()
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			if err == nil { // no kube-controller-manager here to make it
				_, err = cs.CoreV1().ServiceAccounts(o.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			}
		case *corev1.Pod:
			_, err = cs.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pod := func(ns, name, node string, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	}
	mk(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ok", Labels: map[string]string{kubenames.LabelLAN: kubenames.LabelLANAllowed}}})
	mk(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "no"}})
	mk(pod("ok", "fixed", "n1", map[string]string{kubenames.AnnotationLANIP: "192.168.50.210"}))
	mk(pod("ok", "plain", "n1", nil))
	mk(pod("ok", "bad", "n1", map[string]string{kubenames.AnnotationLAN: "maybe"}))
	mk(pod("ok", "elsewhere", "n2", map[string]string{kubenames.AnnotationLANAddress: "net1=192.168.50.220/24"}))
	mk(pod("no", "asks", "n1", map[string]string{kubenames.AnnotationLAN: "true"}))

	f := informers.NewSharedInformerFactory(cs, 0)
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	ctl, err := New(Config{Network: "net", Node: "n1", Client: cs, Pods: f.Core().V1().Pods().Informer(),
		Namespaces: f.Core().V1().Namespaces().Informer(), Logf: t.Logf,
		Events: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: kubenames.Agent, Host: "n1"})})
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() }) // the informers stop with ctx
	f.WaitForCacheSync(ctx.Done())
	ref := func(ns, name string) agentsock.Pod { return agentsock.Pod{Namespace: ns, Name: name} }

	if got, err := ctl.LANPod(ctx, "net", ref("ok", "fixed")); err != nil || !got.Want || len(got.IPs) != 1 || got.IPs[0] != "192.168.50.210" {
		t.Errorf("ok/fixed: %+v, %v", got, err)
	}
	if got, err := ctl.LANPod(ctx, "net", ref("ok", "plain")); err != nil || got.Want {
		t.Errorf("ok/plain asked nothing: %+v, %v", got, err)
	}
	if _, err := ctl.LANPod(ctx, "net", ref("no", "asks")); err == nil || !strings.Contains(err.Error(), kubenames.LabelLAN) {
		t.Errorf("no/asks: want a refusal naming the label, got %v", err)
	}
	if _, err := ctl.LANPod(ctx, "net", ref("ok", "bad")); err == nil || !strings.Contains(err.Error(), kubenames.AnnotationLAN) {
		t.Errorf("ok/bad: want a refusal naming the annotation, got %v", err)
	}
	mk(pod("ok", "late", "n1", map[string]string{kubenames.AnnotationLAN: "true"}))
	if got, err := ctl.LANPod(ctx, "net", ref("ok", "late")); err != nil || !got.Want {
		t.Errorf("ok/late, created after the informers synced: %+v, %v", got, err)
	}
	start := time.Now()
	if _, err := ctl.LANPod(ctx, "net", ref("ok", "never")); !errors.Is(err, agentsock.ErrRetry) || time.Since(start) < lanWait {
		t.Errorf("a pod that never comes: want ErrRetry after %s, got %v after %s", lanWait, err, time.Since(start))
	}
	if err := ctl.LANReport(ctx, "net", ref("ok", "fixed"), agentsock.Report{IfName: "net1", Addresses: []string{"192.168.50.210/24"}}); err != nil {
		t.Fatal(err)
	}

	// The Events the recorder wrote, and the annotation, read back from
	// the API; the listing from the controller.
	within(t, "the Events on no/asks and ok/bad", func() bool {
		evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Source.Component == kubenames.Agent {
				seen[e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name+" "+e.Reason] = true
			}
		}
		return seen["no/asks "+kubenames.ReasonLANForbidden] && seen["ok/bad "+kubenames.ReasonLANInvalid]
	})
	within(t, "ok/fixed's lan-address annotation, and the listing of n1's LAN pods", func() bool {
		pods, err := ctl.LANList(ctx)
		return err == nil && len(pods) == 1 && pods[0].Namespace == "ok" && pods[0].Name == "fixed" && pods[0].Addresses == "net1=192.168.50.210/24"
	})
}

// within polls cond for up to a minute (the API and the informers are
// asynchronous: wait for the condition, never for a time).
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within a minute", what)
}
