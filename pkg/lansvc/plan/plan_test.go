package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/elect"
)

// The Service ranges of the tests: 192.168.1.0/24 and fd00::/64.
func inRanges(ip netip.Addr) bool {
	return netip.MustParsePrefix("192.168.1.0/24").Contains(ip) || netip.MustParsePrefix("fd00::/64").Contains(ip)
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type svcOpt func(*corev1.Service)

func ann(k, v string) svcOpt { return func(s *corev1.Service) { s.Annotations[k] = v } }
func share(key string) svcOpt {
	return ann(kubenames.AnnotationLANShare, key)
}
func lanIP(v string) svcOpt { return ann(kubenames.AnnotationLANIP, v) }
func ports(ps ...int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.Ports = nil
		for _, p := range ps {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: p})
		}
	}
}
func udp(p int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: p, Protocol: corev1.ProtocolUDP})
	}
}
func class(c string) svcOpt { return func(s *corev1.Service) { s.Spec.LoadBalancerClass = &c } }
func clusterIP() svcOpt     { return func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP } }
func local() svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
}
func families(fs ...corev1.IPFamily) svcOpt {
	return func(s *corev1.Service) { s.Spec.IPFamilies = fs }
}
func age(minutes int) svcOpt {
	return func(s *corev1.Service) {
		s.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(minutes) * time.Minute))
	}
}
func ingress(ips ...string) svcOpt {
	return func(s *corev1.Service) {
		for _, ip := range ips {
			if strings.Contains(ip, ".example") {
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{Hostname: ip})
			} else {
				s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
			}
		}
	}
}

// svc is ns/name, type LoadBalancer with port 80/TCP and no class.
func svc(ns, name string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{},
		CreationTimestamp: metav1.NewTime(t0)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	ports(80)(s)
	for _, o := range opts {
		o(s)
	}
	return s
}

func namespaces(allowed ...string) []*corev1.Namespace {
	out := []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "closed"}}}
	for _, n := range allowed {
		out = append(out, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{kubenames.LabelLAN: kubenames.LabelLANAllowed}}})
	}
	return out
}

func node(name string, ready bool, labels map[string]string) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
}

// slice is an EndpointSlice of ns/svcName with one endpoint on each
// node; a name ending in "!" is not ready.
func slice(ns, svcName string, nodes ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svcName + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}}}
	for _, n := range nodes {
		ready := !strings.HasSuffix(n, "!")
		name := strings.TrimSuffix(n, "!")
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{NodeName: &name, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return es
}

// alone is n1's input when it is the only live agent.
func alone(svcs ...*corev1.Service) *Input {
	return &Input{Node: "n1", Services: svcs, Namespaces: namespaces("lan", "lan2"), Live: []string{"n1"},
		Alive: func(n string) bool { return n == "n1" }, InRanges: inRanges, Owners: map[store.Owner][]netip.Addr{}}
}

// events says the plan's Events as "ns/name:Reason", sorted.
func events(p Plan) []string {
	var out []string
	for _, e := range p.Events {
		out = append(out, e.Service.Namespace+"/"+e.Service.Name+":"+e.Reason)
	}
	slices.Sort(out)
	return out
}

// writes says the plan's writes as "owner services [families] [addrs]"
// or "owner services forbidden".
func writes(p Plan) []string {
	var out []string
	for _, w := range p.Writes {
		var names []string
		for _, s := range w.Services {
			names = append(names, s.Name)
		}
		if w.Forbidden {
			out = append(out, fmt.Sprintf("%s %s forbidden", w.Owner.ContainerID, strings.Join(names, ",")))
			continue
		}
		if w.Request.Owner != w.Owner {
			out = append(out, "request of another owner: "+w.Request.Owner.ContainerID)
		}
		out = append(out, fmt.Sprintf("%s %s %v %v", w.Owner.ContainerID, strings.Join(names, ","), w.Request.Families, w.Request.Addrs))
	}
	return out
}

func TestPlanWrites(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		requireClass bool
		svcs         []*corev1.Service
		writes       []string
		events       []string
	}{
		{name: "no class, allowed namespace", svcs: []*corev1.Service{svc("lan", "web")},
			writes: []string{"village-lb_lan_web web [] []"}},
		{name: "no class with requireClass", requireClass: true, svcs: []*corev1.Service{svc("lan", "web")}},
		{name: "Village's class with requireClass", requireClass: true, svcs: []*corev1.Service{svc("lan", "web", class(kubenames.LoadBalancerClassLAN))},
			writes: []string{"village-lb_lan_web web [] []"}},
		{name: "another class", svcs: []*corev1.Service{svc("lan", "web", class("example.com/lb"))}},
		{name: "not LoadBalancer", svcs: []*corev1.Service{svc("lan", "web", clusterIP())}},
		{name: "namespace not allowed", svcs: []*corev1.Service{svc("closed", "web"), svc("unknown", "db")},
			writes: []string{"village-lb_closed_web web forbidden", "village-lb_unknown_db db forbidden"},
			events: []string{"closed/web:LANForbidden", "unknown/db:LANForbidden"}},
		{name: "the Service's families", svcs: []*corev1.Service{svc("lan", "web", families(corev1.IPv6Protocol, corev1.IPv4Protocol))},
			writes: []string{"village-lb_lan_web web [6 4] []"}},
		{name: "lan-ip decides the families", svcs: []*corev1.Service{svc("lan", "web", families(corev1.IPv4Protocol, corev1.IPv6Protocol), lanIP(" 192.168.1.50 "))},
			writes: []string{"village-lb_lan_web web [4] [192.168.1.50]"}},
		{name: "lan-ip of the other family only", svcs: []*corev1.Service{svc("lan", "web", families(corev1.IPv4Protocol), lanIP("fd00::50"))},
			writes: []string{"village-lb_lan_web web [6] [fd00::50]"}},
		{name: "lan-ip dual stack", svcs: []*corev1.Service{svc("lan", "web", lanIP("192.168.1.50,fd00::50"))},
			writes: []string{"village-lb_lan_web web [4 6] [192.168.1.50 fd00::50]"}},
		{name: "lan-ip invalid", svcs: []*corev1.Service{svc("lan", "web", lanIP("192.168.1.500"))},
			events: []string{"lan/web:LANRequestInvalid"}},
		{name: "lan-ip invalid in a group refuses the group", svcs: []*corev1.Service{
			svc("lan", "a", share("k"), lanIP("nope")), svc("lan", "b", share("k"), ports(443), lanIP("nope"), age(1))},
			events: []string{"lan/a:LANRequestInvalid", "lan/b:LANRequestInvalid"}},
		{name: "share group, oldest first", svcs: []*corev1.Service{
			svc("lan", "b", share("k"), ports(443), age(1)), svc("lan", "a", share("k"), age(2)), svc("lan", "c", share("k"), ports(8080))},
			writes: []string{"village-lb_lan_k c,b,a [] []"}},
		{name: "same age: by name", svcs: []*corev1.Service{svc("lan", "b", share("k"), ports(443)), svc("lan", "a", share("k"))},
			writes: []string{"village-lb_lan_k a,b [] []"}},
		{name: "share group, ports clash", svcs: []*corev1.Service{
			svc("lan", "a", share("k")), svc("lan", "b", share("k"), ports(443, 80), age(1)), svc("lan", "c", share("k"), ports(443), age(2))},
			writes: []string{"village-lb_lan_k a,c [] []"}, events: []string{"lan/b:LANPortsClash"}},
		{name: "same port, other protocol", svcs: []*corev1.Service{svc("lan", "a", share("k")), svc("lan", "b", share("k"), ports(), udp(80), age(1))},
			writes: []string{"village-lb_lan_k a,b [] []"}},
		{name: "share group, lan-ip differs", svcs: []*corev1.Service{
			svc("lan", "a", share("k"), lanIP("192.168.1.9")), svc("lan", "b", share("k"), ports(443), lanIP("192.168.1.8"), age(1)),
			svc("lan", "c", share("k"), ports(22), age(2))},
			writes: []string{"village-lb_lan_k a,c [4] [192.168.1.9]"}, events: []string{"lan/b:LANRequestInvalid"}},
		{name: "share key invalid", svcs: []*corev1.Service{svc("lan", "a", share("no/slash"))},
			events: []string{"lan/a:LANRequestInvalid"}},
		{name: "a share key is one namespace's", svcs: []*corev1.Service{svc("lan", "a", share("k")), svc("lan2", "a", share("k"))},
			writes: []string{"village-lb_lan2_k a [] []", "village-lb_lan_k a [] []"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := alone(tc.svcs...)
			in.RequireClass = tc.requireClass
			p := in.Plan()
			if got := writes(p); !slices.Equal(got, tc.writes) {
				t.Errorf("writes\n got %q\nwant %q", got, tc.writes)
			}
			if got := events(p); !slices.Equal(got, tc.events) {
				t.Errorf("events\n got %q\nwant %q", got, tc.events)
			}
		})
	}
}

// TestOneWriterPerGroup: with three live agents, each group is written
// by exactly one of them, and each former Service cleared by one.
func TestOneWriterPerGroup(t *testing.T) {
	t.Parallel()
	var svcs []*corev1.Service
	for i := range 20 {
		svcs = append(svcs, svc("lan", fmt.Sprint("s", i)), svc("lan", fmt.Sprint("g", i), share(fmt.Sprint("k", i%4)), ports(int32(1000+i))))
		svcs = append(svcs, svc("lan", fmt.Sprint("old", i), clusterIP(), ann(kubenames.AnnotationLANAnnouncer, "n2")))
	}
	live := []string{"n1", "n2", "n3"}
	written, cleared := map[string]string{}, map[string]string{}
	for _, n := range live {
		in := &Input{Node: n, Services: svcs, Namespaces: namespaces("lan"), Live: live, InRanges: inRanges, Alive: func(string) bool { return true }}
		p := in.Plan()
		for _, w := range p.Writes {
			if other, ok := written[w.Owner.ContainerID]; ok {
				t.Errorf("%s written by %s and %s", w.Owner.ContainerID, other, n)
			}
			written[w.Owner.ContainerID] = n
		}
		for _, c := range p.Clears {
			if other, ok := cleared[c.Service.Name]; ok {
				t.Errorf("%s cleared by %s and %s", c.Service.Name, other, n)
			}
			cleared[c.Service.Name] = n
		}
	}
	if len(written) != 24 || len(cleared) != 20 {
		t.Errorf("%d groups written (want 24), %d Services cleared (want 20)", len(written), len(cleared))
	}
	if by := slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, n := range written {
			yield(n)
		}
	})); len(by) < 2 {
		t.Errorf("all 24 groups written by %v", by)
	}
}

func TestPlanClears(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		svc   *corev1.Service
		clear string // "" none, else the foreign ingress kept and whether the status changes
	}{
		{name: "ClusterIP with the annotation", svc: svc("lan", "a", clusterIP(), ann(kubenames.AnnotationLANAnnouncer, "n1"), ingress("192.168.1.5", "10.0.0.1", "lb.example")),
			clear: "[10.0.0.1 lb.example] true"},
		{name: "another class with the annotation, no ingress of ours", svc: svc("lan", "a", class("x/y"), ann(kubenames.AnnotationLANAnnouncer, "n9"), ingress("10.0.0.1")),
			clear: "[10.0.0.1] false"},
		{name: "ClusterIP without the annotation", svc: svc("lan", "a", clusterIP(), ingress("192.168.1.5"))},
		{name: "still Village's", svc: svc("lan", "a", ann(kubenames.AnnotationLANAnnouncer, "n1"), ingress("192.168.1.5"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := alone(tc.svc).Plan()
			var got string
			for _, c := range p.Clears {
				var keep []string
				for _, in := range c.Ingress {
					keep = append(keep, in.IP+in.Hostname)
				}
				got += fmt.Sprintf("%v %v", keep, c.UpdateStatus)
			}
			if got != tc.clear {
				t.Errorf("clears %q, want %q", got, tc.clear)
			}
		})
	}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// wants says the answer's wants as "addr:node,node", and its
// announcements as "addr:svc,svc".
func wants(a Answer) (w, ann []string) {
	for _, x := range a.Wants {
		w = append(w, x.Addr.String()+":"+strings.Join(x.Eligible, ","))
	}
	for _, x := range a.Announce {
		var names []string
		for _, s := range x.Services {
			names = append(names, s.Name)
		}
		ann = append(ann, x.Addr.String()+":"+strings.Join(names, ","))
	}
	return w, ann
}

func TestAnswer(t *testing.T) {
	t.Parallel()
	nodes := []*corev1.Node{node("n1", true, nil), node("n2", true, nil), node("n3", false, nil),
		node("n4", true, map[string]string{kubenames.LabelExcludeFromLB: ""})}
	for _, tc := range []struct {
		name     string
		svcs     []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		owners   map[store.Owner][]netip.Addr
		releases []string
		wants    []string
		announce []string
	}{
		{name: "Cluster: the Ready nodes not excluded", svcs: []*corev1.Service{svc("lan", "web")},
			owners: map[store.Owner][]netip.Addr{alloc.ServiceOwner("lan", "web"): addrs("192.168.1.5", "fd00::5")},
			wants:  []string{"192.168.1.5:n1,n2", "fd00::5:n1,n2"}, announce: []string{"192.168.1.5:web", "fd00::5:web"}},
		{name: "Local: the nodes with a ready endpoint", svcs: []*corev1.Service{svc("lan", "web", local())},
			slices: []*discoveryv1.EndpointSlice{slice("lan", "web", "n2", "n3", "n9!"), slice("lan", "other", "n1"), slice("lan2", "web", "n1")},
			owners: map[store.Owner][]netip.Addr{alloc.ServiceOwner("lan", "web"): addrs("192.168.1.5")},
			wants:  []string{"192.168.1.5:n2,n3"}},
		{name: "a group takes the nodes eligible for all its Services", svcs: []*corev1.Service{svc("lan", "a", share("k"), local()), svc("lan", "b", share("k"), ports(443))},
			slices: []*discoveryv1.EndpointSlice{slice("lan", "a", "n1", "n3")},
			owners: map[store.Owner][]netip.Addr{alloc.ShareOwner("lan", "k"): addrs("192.168.1.7")},
			wants:  []string{"192.168.1.7:n1"}, announce: []string{"192.168.1.7:a,b"}},
		{name: "a refused Service is not announced", svcs: []*corev1.Service{svc("lan", "a", share("k")), svc("lan", "b", share("k"), age(1))},
			owners: map[store.Owner][]netip.Addr{alloc.ShareOwner("lan", "k"): addrs("192.168.1.7")},
			wants:  []string{"192.168.1.7:n1,n2"}, announce: []string{"192.168.1.7:a"}},
		{name: "gone, no longer LoadBalancer or forbidden: released", svcs: []*corev1.Service{svc("lan", "old", clusterIP()), svc("closed", "x")},
			owners: map[store.Owner][]netip.Addr{alloc.ServiceOwner("lan", "gone"): addrs("192.168.1.5"),
				alloc.ServiceOwner("lan", "old"): addrs("192.168.1.6"), alloc.ServiceOwner("closed", "x"): addrs("192.168.1.7")},
			releases: []string{"village-lb_closed_x [192.168.1.7]", "village-lb_lan_gone [192.168.1.5]", "village-lb_lan_old [192.168.1.6]"}},
		{name: "no address yet: no want", svcs: []*corev1.Service{svc("lan", "web")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := alone(tc.svcs...)
			in.Nodes, in.EndpointSlices = nodes, tc.slices
			if tc.owners != nil {
				in.Owners = tc.owners
			}
			a := in.Answer()
			var rel []string
			for _, r := range a.Releases {
				rel = append(rel, fmt.Sprintf("%s %v", r.Owner.ContainerID, r.Addrs))
			}
			if !slices.Equal(rel, tc.releases) {
				t.Errorf("releases\n got %q\nwant %q", rel, tc.releases)
			}
			w, ann := wants(a)
			if !slices.Equal(w, tc.wants) {
				t.Errorf("wants\n got %q\nwant %q", w, tc.wants)
			}
			// n1 alone is alive: it answers for every address it is
			// eligible for.
			wantAnn := tc.announce
			if !slices.Equal(ann, wantAnn) {
				t.Errorf("announce\n got %q\nwant %q", ann, wantAnn)
			}
		})
	}
}

// TestAnswerOneReleaser: of three live agents, one releases each gone
// owner; and every agent computes the same wants.
func TestAnswerOneReleaser(t *testing.T) {
	t.Parallel()
	owners := map[store.Owner][]netip.Addr{}
	for i := range 12 {
		owners[alloc.ServiceOwner("lan", fmt.Sprint("gone", i))] = addrs(fmt.Sprint("192.168.1.", 10+i))
	}
	owners[alloc.ServiceOwner("lan", "web")] = addrs("192.168.1.2")
	live := []string{"n1", "n2", "n3"}
	released := map[store.Owner]int{}
	var first []elect.Want
	announced := 0
	for _, n := range live {
		in := &Input{Node: n, Services: []*corev1.Service{svc("lan", "web")}, Namespaces: namespaces("lan"), Live: live, Owners: owners,
			Nodes: []*corev1.Node{node("n1", true, nil), node("n2", true, nil), node("n3", true, nil)}, InRanges: inRanges, Alive: func(string) bool { return true }}
		a := in.Answer()
		for _, r := range a.Releases {
			released[r.Owner]++
		}
		if first == nil {
			first = a.Wants
		} else if fmt.Sprint(first) != fmt.Sprint(a.Wants) {
			t.Errorf("%s wants %v, n1 %v", n, a.Wants, first)
		}
		announced += len(a.Announce)
	}
	if len(released) != 12 {
		t.Errorf("%d owners released, want 12", len(released))
	}
	for o, k := range released {
		if k != 1 {
			t.Errorf("%s released by %d agents", o.ContainerID, k)
		}
	}
	if announced != 1 {
		t.Errorf("192.168.1.2 announced by %d agents", announced)
	}
}

func TestIngress(t *testing.T) {
	t.Parallel()
	vip := corev1.LoadBalancerIPModeVIP
	for _, tc := range []struct {
		name    string
		svc     *corev1.Service
		ips     []netip.Addr
		want    string
		changed bool
	}{
		{name: "none yet", svc: svc("lan", "a"), ips: addrs("192.168.1.5"), want: "192.168.1.5/VIP", changed: true},
		{name: "foreign first, kept", svc: svc("lan", "a", ingress("lb.example", "10.0.0.1", "192.168.1.9")), ips: addrs("192.168.1.5", "fd00::5"),
			want: "lb.example/ 10.0.0.1/ 192.168.1.5/VIP fd00::5/VIP", changed: true},
		{name: "cleared", svc: svc("lan", "a", ingress("192.168.1.5", "10.0.0.1")), want: "10.0.0.1/", changed: true},
		{name: "nothing to clear", svc: svc("lan", "a", ingress("10.0.0.1"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, changed := Ingress(tc.svc, tc.ips, inRanges)
			var s []string
			for _, in := range got {
				mode := ""
				if in.IPMode != nil {
					mode = string(*in.IPMode)
				}
				s = append(s, in.IP+in.Hostname+"/"+mode)
			}
			if strings.Join(s, " ") != tc.want || changed != tc.changed {
				t.Errorf("got %q %v, want %q %v", s, changed, tc.want, tc.changed)
			}
		})
	}
	// What Ingress wrote is what it then leaves alone.
	s := svc("lan", "a", ingress("10.0.0.1"))
	s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: "192.168.1.5", IPMode: &vip})
	if _, changed := Ingress(s, addrs("192.168.1.5"), inRanges); changed {
		t.Error("the status says 192.168.1.5 already, and Ingress changes it")
	}
}

func TestRefusal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err     error
		reason  string
		refused bool
	}{
		{&alloc.Error{Kind: alloc.Taken}, kubenames.ReasonLANTaken, true},
		{fmt.Errorf("wrapped: %w", &alloc.Error{Kind: alloc.Outside}), kubenames.ReasonLANOutsidePool, true},
		{&alloc.Error{Kind: alloc.Exhausted}, kubenames.ReasonLANExhausted, true},
		{errors.Join(errors.New("x"), &alloc.Error{Kind: alloc.NoRange}), kubenames.ReasonLANExhausted, true},
		{errors.New("etcd: context deadline exceeded"), kubenames.ReasonLANFailed, false},
	} {
		if reason, refused := Refusal(tc.err); reason != tc.reason || refused != tc.refused {
			t.Errorf("Refusal(%v) = %s %v, want %s %v", tc.err, reason, refused, tc.reason, tc.refused)
		}
	}
}
