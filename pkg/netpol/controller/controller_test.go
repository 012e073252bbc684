package controller

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netpol"
)

// TestSlimKeepsWhatCompileReads: the cached copy of a Pod still yields the
// same netpol.Pod, and drops the rest.
func TestSlimKeepsWhatCompileReads(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{"app": "x"},
			Annotations: map[string]string{kubenames.AnnotationLANAddress: "net1=192.168.50.210/24", kubenames.AnnotationLANIP: "192.168.50.210",
				kubenames.AnnotationLAN: "true", "other": "big"}},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: false,
			InitContainers: []corev1.Container{{Name: "side", Image: "i", Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}},
			Containers: []corev1.Container{{Name: "c", Image: "i", Command: []string{"serve"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 9}, {Name: "s", ContainerPort: 7, Protocol: corev1.ProtocolSCTP}}},
				{Name: "noports", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}, {IP: "bogus"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}},
	}
	o, err := SlimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*corev1.Pod)
	// Village's annotations stay: the LAN pods controller reads them from
	// the same cache.
	if len(s.Annotations) != 3 || s.Annotations[kubenames.AnnotationLANIP] != "192.168.50.210" || s.Annotations[kubenames.AnnotationLAN] != "true" ||
		len(s.Spec.Containers) != 1 || s.Spec.Containers[0].Image != "" || len(s.Status.Conditions) != 0 {
		t.Errorf("slim kept too much: %+v", s)
	}
	a, b := podOf(p), podOf(s)
	// The lan-address annotation is the user's to edit: it never makes a
	// pod a LAN pod (the controller asks Config.LAN, the node's own state).
	if a.Key() != "ns/p" || a.LAN || len(a.IPs) != 2 || len(a.Ports) != 3 {
		t.Errorf("podOf: %+v", a)
	}
	if len(a.IPs) != len(b.IPs) || len(a.Ports) != len(b.Ports) || a.LAN != b.LAN || a.Labels["app"] != b.Labels["app"] {
		t.Errorf("slim changed what compile reads: %+v vs %+v", a, b)
	}
	if b.Ports[0].Name != "dns" || b.Ports[0].Protocol != 17 || b.Ports[2].Protocol != 132 || b.Ports[1].Protocol != 6 {
		t.Errorf("ports: %+v", b.Ports)
	}
	if o, _ := SlimPod("not a pod"); o != "not a pod" {
		t.Errorf("slim of a tombstone: %v", o)
	}
}

// TestCompileReads: the updates a starting pod gets from kubelet that
// change nothing the compile reads do not start a compile; every change
// of a field it reads does.
func TestCompileReads(t *testing.T) {
	base := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", ResourceVersion: "1", Labels: map[string]string{"app": "x"}},
			Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodPending}}
	}
	ns := func(rv string, labels map[string]string, phase corev1.NamespacePhase) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", ResourceVersion: rv, Labels: labels}, Status: corev1.NamespaceStatus{Phase: phase}}
	}
	for _, tc := range []struct {
		name string
		edit func(*corev1.Pod)
		want bool
	}{
		{"conditions and container statuses only", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", Ready: true}}
			p.Annotations = map[string]string{"other": "x"}
		}, false},
		{"address", func(p *corev1.Pod) { p.Status.PodIPs = []corev1.PodIP{{IP: "10.0.0.5"}} }, true},
		{"phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
		{"label", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "y"} }, true},
		{"node", func(p *corev1.Pod) { p.Spec.NodeName = "n2" }, true},
		{"named port", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 81 }, true},
		// the agent writes it right after the plugin's report: the compile
		// it starts asks Config.LAN, which has the report by then
		{"LAN annotation", func(p *corev1.Pod) {
			p.Annotations = map[string]string{kubenames.AnnotationLANAddress: "net1=192.168.50.210/24"}
		}, true},
	} {
		old, cur := base(), base()
		tc.edit(cur)
		cur.ResourceVersion = "2"
		so, _ := SlimPod(old)
		sc, _ := SlimPod(cur)
		if got := compileReads(so, sc); got != tc.want {
			t.Errorf("pod %s: compileReads %v, want %v", tc.name, got, tc.want)
		}
	}
	if compileReads(ns("1", map[string]string{"a": "1"}, corev1.NamespaceActive), ns("2", map[string]string{"a": "1"}, corev1.NamespaceTerminating)) {
		t.Error("a namespace's phase alone started a compile")
	}
	if !compileReads(ns("1", map[string]string{"a": "1"}, corev1.NamespaceActive), ns("2", map[string]string{"a": "2"}, corev1.NamespaceActive)) {
		t.Error("a namespace's label change did not start a compile")
	}
	if !compileReads(&networkingv1.NetworkPolicy{}, &networkingv1.NetworkPolicy{}) {
		t.Error("a policy update did not start a compile")
	}
}

// TestLANFromOwnState: which local pods the compile treats as LAN pods (the
// NetworkPolicyNotEnforced warning) is Config.LAN's answer, the node's own
// state; a lan-address annotation, which users may edit, counts for
// nothing either way.
func TestLANFromOwnState(t *testing.T) {
	pods := cache.NewStore(cache.MetaNamespaceKeyFunc)
	mk := func(name, node, ann string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.PodSpec{NodeName: node}}
		if ann != "" {
			p.Annotations = map[string]string{kubenames.AnnotationLANAddress: ann}
		}
		if err := pods.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	mk("real", "n1", "")                       // on the LAN, its annotation removed by a user
	mk("forged", "n1", "net1=192.168.50.9/24") // not on the LAN, a forged annotation
	mk("remote", "n2", "net1=192.168.50.8/24")
	onLAN := map[string]bool{"real": true, "remote": true}
	for _, tc := range []struct {
		name string
		lan  func(*corev1.Pod) bool
		want map[string]bool
	}{
		{"own state", func(p *corev1.Pod) bool { return onLAN[p.Name] }, map[string]bool{"ns/real": true}},
		{"no LAN section", nil, map[string]bool{}},
	} {
		c := &ctl{cfg: Config{Network: "net", Node: "n1", LAN: tc.lan}, pods: pods,
			nss: cache.NewStore(cache.MetaNamespaceKeyFunc), pols: cache.NewStore(cache.MetaNamespaceKeyFunc)}
		got := map[string]bool{}
		for _, p := range c.input().Pods {
			if p.LAN {
				got[p.Key()] = true
			}
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("%s: LAN pods %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestCountLocal: the status's "local pods compiled" counts this node's
// pods whose traffic is filtered; host-network pods and other nodes' pods
// are not.
func TestCountLocal(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pods  []*netpol.Pod
		local []string
		want  int
	}{
		{"none", nil, nil, 0},
		{"local pods", []*netpol.Pod{{Namespace: "a", Name: "p"}, {Namespace: "a", Name: "q"}}, []string{"a/p", "a/q"}, 2},
		{"another node's pod", []*netpol.Pod{{Namespace: "a", Name: "p"}, {Namespace: "a", Name: "far"}}, []string{"a/p"}, 1},
		{"host network", []*netpol.Pod{{Namespace: "kube-system", Name: "villaged", HostNetwork: true}, {Namespace: "a", Name: "p"}}, []string{"kube-system/villaged", "a/p"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := netpol.Input{Pods: tc.pods, Local: map[string]bool{}}
			for _, k := range tc.local {
				in.Local[k] = true
			}
			if got := countLocal(in); got != tc.want {
				t.Fatalf("countLocal = %d, want %d", got, tc.want)
			}
		})
	}
}
