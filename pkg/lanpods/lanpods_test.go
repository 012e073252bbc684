package lanpods

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
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

	// Users may edit the annotation: a false address on the LAN pod, and
	// one on a pod that has no LAN interface. The listing and HasLAN (the
	// NetworkPolicy warning's question) keep to what the plugin reported.
	// (after the agent's own write of the annotation, which would
	// otherwise land on top of the forgery)
	within(t, "ok/fixed's lan-address annotation written by the report", func() bool {
		p, err := cs.CoreV1().Pods("ok").Get(ctx, "fixed", metav1.GetOptions{})
		return err == nil && p.Annotations[kubenames.AnnotationLANAddress] == "net1=192.168.50.210/24"
	})
	forged := map[string]string{"fixed": "net1=192.168.50.99/24", "plain": "net1=192.168.50.98/24"}
	for name, v := range forged {
		patch := `{"metadata":{"annotations":{"` + kubenames.AnnotationLANAddress + `":"` + v + `"}}}`
		if _, err := cs.CoreV1().Pods("ok").Patch(ctx, name, ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cached := func(name string) *corev1.Pod {
		obj, _, _ := f.Core().V1().Pods().Informer().GetStore().GetByKey("ok/" + name)
		p, _ := obj.(*corev1.Pod)
		return p
	}
	within(t, "the informer sees the forged annotations", func() bool {
		for name, v := range forged {
			if p := cached(name); p == nil || p.Annotations[kubenames.AnnotationLANAddress] != v {
				return false
			}
		}
		return true
	})
	pods, err := ctl.LANList(ctx)
	if err != nil || len(pods) != 1 || pods[0].Name != "fixed" || pods[0].Addresses != "net1=192.168.50.210/24" {
		t.Errorf("listing after the annotations were forged: %+v, %v; want only ok/fixed net1=192.168.50.210/24", pods, err)
	}
	if !ctl.HasLAN(cached("fixed")) || ctl.HasLAN(cached("plain")) {
		t.Errorf("HasLAN: fixed %v (want true), plain %v (want false: its annotation is forged)", ctl.HasLAN(cached("fixed")), ctl.HasLAN(cached("plain")))
	}

	// A restarted agent has no reports: the LAN pool's store says what
	// each pod holds, by the pod's address on the network.
	for name, ip := range map[string]string{"fixed": "10.244.1.5", "plain": "10.244.1.6"} {
		p, err := cs.CoreV1().Pods("ok").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		if _, err := cs.CoreV1().Pods("ok").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	within(t, "the informer sees the pods' addresses", func() bool {
		return len(cached("fixed").Status.PodIPs) == 1 && len(cached("plain").Status.PodIPs) == 1
	})
	held := map[netip.Addr][]netip.Addr{netip.MustParseAddr("10.244.1.5"): {netip.MustParseAddr("192.168.50.210")}}
	again, err := New(Config{Network: "net", Node: "n1", Client: cs, Pods: f.Core().V1().Pods().Informer(),
		Namespaces: f.Core().V1().Namespaces().Informer(), Logf: t.Logf, IfName: "net1",
		Held: func(context.Context) (map[netip.Addr][]netip.Addr, error) { return held, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if again.HasLAN(cached("fixed")) {
		t.Error("a controller with no report and no store read yet says ok/fixed has a LAN interface")
	}
	if err := again.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	select { // the NetworkPolicy controller is told to compile again
	case <-again.LANChanged():
	default:
		t.Error("a Refresh that found ok/fixed's LAN address sent nothing on LANChanged")
	}
	pods, err = again.LANList(ctx)
	if err != nil || len(pods) != 1 || pods[0].Name != "fixed" || pods[0].Addresses != "net1=192.168.50.210" {
		t.Errorf("listing from the store: %+v, %v; want only ok/fixed net1=192.168.50.210", pods, err)
	}
	if !again.HasLAN(cached("fixed")) || again.HasLAN(cached("plain")) {
		t.Errorf("HasLAN from the store: fixed %v (want true), plain %v (want false)", again.HasLAN(cached("fixed")), again.HasLAN(cached("plain")))
	}
	// The address released (the pod's DEL): gone from the listing.
	held = map[netip.Addr][]netip.Addr{}
	if pods, err = again.LANList(ctx); err != nil || len(pods) != 0 {
		t.Errorf("listing after the store released the address: %+v, %v", pods, err)
	}
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
