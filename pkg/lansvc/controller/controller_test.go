package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/elect"
)

// speakerRec keeps the last wants.
type speakerRec struct {
	mu sync.Mutex
	w  []elect.Want
}

func (s *speakerRec) SetWants(w []elect.Want) { s.mu.Lock(); s.w = w; s.mu.Unlock() }
func (s *speakerRec) get() []elect.Want       { s.mu.Lock(); defer s.mu.Unlock(); return s.w }

type env struct {
	t     *testing.T
	ctx   context.Context
	cs    kubernetes.Interface
	store store.Store
	sp    *speakerRec
	ctl   *Controller
}

// start runs a real kube-apiserver, a disk store (the LAN pool's) in a
// temp dir and the controller over shared informers, as the agent does.
func start(t *testing.T, ranges string, requireClass bool, opts ...func(*Config)) *env {
	kube := kubetest.Start(t, kubetest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := disk.New(disk.Options{DataDir: t.TempDir(), Network: "lan"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, sets, err := config.ParseRanges([]byte(`{"ranges":` + ranges + `}`))
	if err != nil {
		t.Fatal(err)
	}
	f := informers.NewSharedInformerFactory(kube.Client, 0)
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.Client.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	e := &env{t: t, ctx: ctx, cs: kube.Client, store: st, sp: &speakerRec{}}
	cfg := Config{Node: "n1", Client: kube.Client,
		Services: f.Core().V1().Services().Informer(), EndpointSlices: f.Discovery().V1().EndpointSlices().Informer(),
		Nodes: f.Core().V1().Nodes().Informer(), Namespaces: f.Core().V1().Namespaces().Informer(),
		Events:       b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: kubenames.Agent, Host: "n1"}),
		Alloc:        &alloc.Allocator{Store: st, Sets: sets},
		RequireClass: requireClass, Speaker: e.sp, Resync: time.Second, Logf: t.Logf,
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.ctl, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { e.ctl.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait(); f.Shutdown() })
	return e
}

func (e *env) ns(name string, allowed bool) {
	e.t.Helper()
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if allowed {
		n.Labels = map[string]string{kubenames.LabelLAN: kubenames.LabelLANAllowed}
	}
	if _, err := e.cs.CoreV1().Namespaces().Create(e.ctx, n, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) node(name string, ready bool, labels map[string]string) {
	e.t.Helper()
	n, err := e.cs.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}
	if _, err := e.cs.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

type svcOpt func(*corev1.Service)

func ann(k, v string) svcOpt { return func(s *corev1.Service) { s.Annotations[k] = v } }
func ports(ps ...int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.Ports = nil
		for _, p := range ps {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprint("p", p), Port: p, TargetPort: intstr.FromInt32(p)})
		}
	}
}
func class(c string) svcOpt { return func(s *corev1.Service) { s.Spec.LoadBalancerClass = &c } }
func local() svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
}

func (e *env) svc(ns, name string, opts ...svcOpt) {
	e.t.Helper()
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name}}}
	ports(80)(s)
	for _, o := range opts {
		o(s)
	}
	if _, err := e.cs.CoreV1().Services(ns).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// ingress is the Service's status addresses; every one must be ipMode VIP.
func (e *env) ingress(ns, name string) string {
	s, err := e.cs.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return "error: " + err.Error()
	}
	var out []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IPMode == nil || *in.IPMode != corev1.LoadBalancerIPModeVIP {
			return "not VIP: " + in.IP
		}
		out = append(out, in.IP)
	}
	return fmt.Sprint(out)
}

func (e *env) wantIngress(ns, name, want string) {
	e.t.Helper()
	within(e.t, fmt.Sprintf("%s/%s's ingress %s", ns, name, want), func() bool { return e.ingress(ns, name) == want })
}

// event waits for an Event of reason on ns/name.
func (e *env) event(ns, name, reason string) {
	e.t.Helper()
	within(e.t, fmt.Sprintf("Event %s on %s/%s", reason, ns, name), func() bool {
		evs, err := e.cs.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == name && ev.InvolvedObject.Kind == "Service" && ev.Reason == reason && ev.Source.Component == kubenames.Agent {
				return true
			}
		}
		return false
	})
}

func (e *env) held(owner store.Owner) []netip.Addr {
	ips, err := e.store.ListByOwner(e.ctx, owner)
	if err != nil {
		e.t.Fatal(err)
	}
	return ips
}

// TestController runs the controller against a real kube-apiserver and
// the LAN pool's disk store: addresses and ipMode VIP in the status, the
// speaker's wants and eligible nodes, the announcer annotation, lan-ip
// honoured and refused, lan-share within a namespace only and refusing
// clashing ports, a forbidden namespace, exhaustion, release on delete and
// on a type change, and a Service of another class left alone.
func TestController(t *testing.T) {
	e := start(t, `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.244"}]]`, false)
	e.ns("home", true)
	e.ns("lab", true)
	e.ns("closed", false)
	e.node("n1", true, nil)
	e.node("n2", true, nil)
	e.node("n3", false, nil)
	e.node("n4", true, map[string]string{kubenames.LabelExcludeFromLB: ""})

	// A pod already holds .240 in the same store.
	if ok, err := e.store.Claim(e.ctx, store.Claim{IP: netip.MustParseAddr("192.168.50.240"), Owner: store.Owner{ContainerID: "pod1", IfName: "net1"}}); !ok || err != nil {
		t.Fatal(ok, err)
	}

	e.svc("home", "web")
	e.wantIngress("home", "web", "[192.168.50.241]")
	e.event("home", "web", kubenames.ReasonLANAssigned)
	// Cluster: the Ready nodes not excluded; n1 (the only live agent) answers.
	within(t, "the speaker's wants", func() bool {
		w := e.sp.get()
		return len(w) == 1 && w[0].Addr == netip.MustParseAddr("192.168.50.241") && fmt.Sprint(w[0].Eligible) == "[n1 n2]"
	})
	within(t, "the announcer annotation", func() bool {
		s, err := e.cs.CoreV1().Services("home").Get(e.ctx, "web", metav1.GetOptions{})
		return err == nil && s.Annotations[kubenames.AnnotationLANAnnouncer] == "n1"
	})
	e.event("home", "web", kubenames.ReasonLANAnnounced)

	// A forbidden namespace: an Event, no address.
	e.svc("closed", "nope")
	e.event("closed", "nope", kubenames.ReasonLANForbidden)

	// lan-ip: the pod's address is taken; a free one is honoured exactly;
	// one outside the ranges is refused.
	e.svc("home", "grab", ann(kubenames.AnnotationLANIP, "192.168.50.240"))
	e.event("home", "grab", kubenames.ReasonLANTaken)
	e.svc("home", "dns", ann(kubenames.AnnotationLANIP, "192.168.50.244"), ports(53))
	e.wantIngress("home", "dns", "[192.168.50.244]")
	e.svc("home", "far", ann(kubenames.AnnotationLANIP, "192.168.50.10"))
	e.event("home", "far", kubenames.ReasonLANOutsidePool)
	// An IPv4 Service asking for an IPv6 address (no IPv6 range here)
	// gets nothing: not a pool IPv4 address in place of the refused one.
	e.svc("home", "six", ann(kubenames.AnnotationLANIP, "fd00::10"))
	e.event("home", "six", kubenames.ReasonLANExhausted)

	// lan-share: a and b share, c clashes on port 80; lab's "k" is another
	// address.
	e.svc("home", "a", ann(kubenames.AnnotationLANShare, "k"), ports(80))
	e.wantIngress("home", "a", "[192.168.50.242]")
	e.svc("home", "b", ann(kubenames.AnnotationLANShare, "k"), ports(443))
	e.wantIngress("home", "b", "[192.168.50.242]")
	e.svc("home", "c", ann(kubenames.AnnotationLANShare, "k"), ports(80, 8080))
	e.event("home", "c", kubenames.ReasonLANPortsClash)
	e.svc("lab", "a", ann(kubenames.AnnotationLANShare, "k"), ports(80))
	e.wantIngress("lab", "a", "[192.168.50.243]")
	if e.ingress("home", "c") != "[]" || e.ingress("home", "grab") != "[]" || e.ingress("closed", "nope") != "[]" || e.ingress("home", "six") != "[]" {
		t.Fatalf("a refused Service has an address: c %s, grab %s, nope %s, six %s", e.ingress("home", "c"), e.ingress("home", "grab"), e.ingress("closed", "nope"), e.ingress("home", "six"))
	}

	// The pool (.241-.244) is full.
	e.svc("home", "more")
	e.event("home", "more", kubenames.ReasonLANExhausted)

	// Another class is not Village's.
	e.svc("home", "other", class("example.com/lb"))

	// Deleting web releases .241; "more" (waiting) gets it.
	if err := e.cs.CoreV1().Services("home").Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wantIngress("home", "more", "[192.168.50.241]")
	if e.ingress("home", "other") != "[]" {
		t.Fatalf("a Service of another class got %s", e.ingress("home", "other"))
	}
	// A type change releases too: lab/a becomes ClusterIP.
	s, err := e.cs.CoreV1().Services("lab").Get(e.ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	if _, err := e.cs.CoreV1().Services("lab").Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "lab/a's share released", func() bool { return len(e.held(alloc.ShareOwner("lab", "k"))) == 0 })
	within(t, "lab/a's status and announcer annotation cleared", func() bool {
		s, err := e.cs.CoreV1().Services("lab").Get(e.ctx, "a", metav1.GetOptions{})
		return err == nil && len(s.Status.LoadBalancer.Ingress) == 0 && s.Annotations[kubenames.AnnotationLANAnnouncer] == ""
	})
	// The shared address goes only when its last Service does.
	for _, name := range []string{"a", "b"} {
		if err := e.cs.CoreV1().Services("home").Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if name == "a" {
			// c no longer clashes (a held port 80): it takes the address.
			e.wantIngress("home", "c", "[192.168.50.242]")
			e.wantIngress("home", "b", "[192.168.50.242]")
		}
	}
	if got := e.held(alloc.ShareOwner("home", "k")); fmt.Sprint(got) != "[192.168.50.242]" {
		t.Fatalf("home's share k holds %v with c still there", got)
	}
	if err := e.cs.CoreV1().Services("home").Delete(e.ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "home's share released with its last Service", func() bool { return len(e.held(alloc.ShareOwner("home", "k"))) == 0 })
}

// externalTrafficPolicy Local: only nodes with a ready local endpoint are
// eligible, and the set follows the EndpointSlices. requireClass leaves
// Services without the class alone.
func TestControllerLocalAndRequireClass(t *testing.T) {
	e := start(t, `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.244"}]]`, true)
	e.ns("home", true)
	e.node("n1", true, nil)
	e.svc("home", "noclass")
	e.svc("home", "web", class(kubenames.LoadBalancerClassLAN), local())
	e.wantIngress("home", "web", "[192.168.50.240]")
	if e.ingress("home", "noclass") != "[]" {
		t.Fatalf("requireClass: a Service without the class got %s", e.ingress("home", "noclass"))
	}
	wantEligible := func(want string) {
		t.Helper()
		within(t, "eligible "+want, func() bool {
			w := e.sp.get()
			return len(w) == 1 && fmt.Sprint(w[0].Eligible) == want
		})
	}
	wantEligible("[]")
	yes, no := true, false
	ep := func(node string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.1.0.5"}, NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "home", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{ep("n2", &yes), ep("n3", &no)}}
	es, err := e.cs.DiscoveryV1().EndpointSlices("home").Create(e.ctx, es, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantEligible("[n2]")
	es.Endpoints = []discoveryv1.Endpoint{ep("n3", &yes)}
	if _, err := e.cs.DiscoveryV1().EndpointSlices("home").Update(e.ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantEligible("[n3]")
	if fmt.Sprint(e.ctl.Wants()) != fmt.Sprint(e.sp.get()) {
		t.Fatal("Wants differs from what the speaker got")
	}
}

// within waits for cond (testenv.WaitFor's bound).
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, what, func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	})
}

// foreignIngress puts addr in ns/name's status, as another load balancer
// (MetalLB, ServiceLB, a cloud's) would: read, add, write, and again from
// the read when Village's controller wrote the Service in between (a
// conflict, which every client of the API retries).
func (e *env) foreignIngress(ns, name, addr string) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := e.cs.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		vip := corev1.LoadBalancerIPModeVIP
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: addr, IPMode: &vip})
		_, err = e.cs.CoreV1().Services(ns).UpdateStatus(e.ctx, s, metav1.UpdateOptions{FieldManager: "other-lb"})
		return err
	})
	if err != nil {
		e.t.Fatalf("%s/%s: adding another load balancer's %s: %v", ns, name, addr, err)
	}
}

// Village adds and removes only addresses of its own ranges: another load
// balancer's address in a Service's status stays there across passes, in
// an allowed namespace (beside Village's) and in one Village does not
// serve (requireClass false: a classless Service there is another load
// balancer's; no write war).
func TestControllerKeepsForeignIngress(t *testing.T) {
	e := start(t, `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.244"}]]`, false)
	e.ns("home", true)
	e.ns("closed", false)
	e.ns("later", true)
	e.node("n1", true, nil)
	e.svc("closed", "metallb")
	e.foreignIngress("closed", "metallb", "203.0.113.8")
	e.event("closed", "metallb", kubenames.ReasonLANForbidden)
	e.svc("home", "web")
	e.wantIngress("home", "web", "[192.168.50.240]")
	e.foreignIngress("home", "web", "203.0.113.7")
	e.wantIngress("home", "web", "[192.168.50.240 203.0.113.7]")
	// Passes after both: a new Service's address is a later pass's work.
	for _, name := range []string{"a", "b"} {
		e.svc("later", name)
		within(t, "later/"+name+" gets an address", func() bool { return e.ingress("later", name) != "[]" })
		if got := e.ingress("home", "web"); got != "[192.168.50.240 203.0.113.7]" {
			t.Fatalf("home/web's ingress %s: another load balancer's 203.0.113.7 or Village's 192.168.50.240 went", got)
		}
		if got := e.ingress("closed", "metallb"); got != "[203.0.113.8]" {
			t.Fatalf("closed/metallb's ingress %s: Village changed the status of a Service it does not serve", got)
		}
	}
	// Deleting it releases Village's address only.
	if err := e.cs.CoreV1().Services("home").Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestControllerContestedAddress: the node elected for an address that
// another MAC answers for (the announcer yielded it, or lost its probe)
// writes a Warning Event naming the address and the MAC, and no announcer
// annotation; once it holds the address the annotation names it, and when
// it loses the address again the annotation goes.
func TestControllerContestedAddress(t *testing.T) {
	var holds atomic.Bool
	foreign := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	e := start(t, `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.241","rangeEnd":"192.168.50.241"}]]`, false, func(c *Config) {
		c.Holds = func(netip.Addr) bool { return holds.Load() }
		c.InUseBy = func(netip.Addr) net.HardwareAddr {
			if holds.Load() {
				return nil
			}
			return foreign
		}
	})
	e.ns("home", true)
	e.node("n1", true, nil)
	e.svc("home", "web")
	e.wantIngress("home", "web", "[192.168.50.241]")
	e.event("home", "web", kubenames.ReasonLANAddressInUse)
	evs, err := e.cs.CoreV1().Events("home").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		switch ev.Reason {
		case kubenames.ReasonLANAddressInUse:
			if ev.Type != corev1.EventTypeWarning || !strings.HasPrefix(ev.Message, "address 192.168.50.241 in use by MAC 02:00:00:00:00:99") {
				t.Errorf("Event %s %s: %q", ev.Type, ev.Reason, ev.Message)
			}
		case kubenames.ReasonLANAnnounced:
			t.Errorf("Event %q while another MAC holds the address", ev.Message)
		}
	}
	annotation := func() string {
		s, err := e.cs.CoreV1().Services("home").Get(e.ctx, "web", metav1.GetOptions{})
		if err != nil {
			return "error: " + err.Error()
		}
		return s.Annotations[kubenames.AnnotationLANAnnouncer]
	}
	if a := annotation(); a != "" {
		t.Fatalf("announcer annotation %q while another MAC holds the address", a)
	}
	holds.Store(true)
	e.ctl.Kick()
	within(t, "the announcer annotation once held", func() bool { return annotation() == "n1" })
	e.event("home", "web", kubenames.ReasonLANAnnounced)
	holds.Store(false)
	e.ctl.Kick()
	within(t, "the announcer annotation gone once yielded", func() bool { return annotation() == "" })
}
