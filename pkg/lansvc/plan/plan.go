// Package plan is the pure core of the LAN Services controller
// (pkg/lansvc/controller): from one picture of the cluster (the Services,
// EndpointSlices, Nodes and Namespaces the informers hold, the live
// agents and the LAN pool's allocations) it computes what one agent must
// do, with no API server, store or clock:
//
//   - Plan: the Events of refusals, the groups this agent writes (what to
//     ask the allocator for, or that a namespace forbids it) and the
//     Services no longer Village's whose ingress and announcer annotation
//     it clears;
//   - Answer: the allocations no group owns any more that this agent
//     releases, the wants handed to the speaker (each address with the
//     nodes that may answer for it) and the addresses this node answers
//     for, with their Services;
//   - Ingress and Refusal: a Service's status.loadBalancer.ingress once
//     its addresses are known, and the Event reason of an allocator's
//     refusal.
//
// The controller lists the informers, calls Plan, allocates and writes,
// reads the store again and calls Answer: the shape of MetalLB's speaker
// over its allocator, and of pkg/netpol under pkg/netpol/controller.
//
// The rules, in order:
//
//   - A Service is Village's when it is type LoadBalancer with
//     spec.loadBalancerClass village.cni.io/lan, or with no class unless
//     RequireClass. Services with one valid village.cni.io/lan-share key
//     in one namespace form one group (one address); any other is a group
//     alone. An invalid key is an Event, and the Service no group's.
//   - A group's Services are taken oldest first; a later one is refused
//     (an Event, from the writer) when one of its ports is taken or its
//     lan-ip request differs from the group's.
//   - One writer per group: elect.Writer over the live agents and the
//     group's key. It alone allocates, writes the status and the Events
//     of the group's refusals, and releases a gone group's addresses.
//   - Every agent computes the wants from the store's addresses (never a
//     Service's status, which users can write): externalTrafficPolicy
//     Local takes the nodes with a ready endpoint, Cluster the Ready
//     nodes without node.kubernetes.io/exclude-from-external-load-
//     balancers; a group takes the nodes eligible for all its Services.
package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/netconf"
)

// Input is one agent's picture of the cluster for one pass.
type Input struct {
	// Node is this agent's node.
	Node         string
	RequireClass bool
	// What the informers hold.
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	Nodes          []*corev1.Node
	Namespaces     []*corev1.Namespace
	// Live lists the live agents, this one included; Alive says whether
	// one is.
	Live  []string
	Alive func(node string) bool
	// Owners are the LAN pool's Service allocations by owner.
	Owners map[store.Owner][]netip.Addr
	// InRanges says whether an address is one of the Service ranges'.
	InRanges func(netip.Addr) bool
}

// Event is an Event to record on a Service.
type Event struct {
	Service               *corev1.Service
	Type, Reason, Message string
}

// Write is a group this agent writes.
type Write struct {
	Owner store.Owner
	// Services are the group's accepted Services, oldest first (all of
	// them when Forbidden).
	Services []*corev1.Service
	// Forbidden: the namespace is not allowed; the Services' Village
	// ingress is cleared and nothing is allocated.
	Forbidden bool
	// Request is what to ask the allocator for; Held is what the owner
	// holds now (the allocator need not be asked when it Holds it).
	Request alloc.Request
	Held    []netip.Addr
}

// Clear is a Service that is no longer Village's (no longer type
// LoadBalancer, or another class) and still carries the announcer
// annotation: the annotation goes, and Village's ingress addresses with
// it when Ingress differs from the status.
type Clear struct {
	Service *corev1.Service
	// Ingress is the foreign ingress, which stays; UpdateStatus says
	// whether the status has more than it.
	Ingress      []corev1.LoadBalancerIngress
	UpdateStatus bool
}

// Plan is what one agent writes in a pass, before it reads the store
// again.
type Plan struct {
	Events []Event
	Writes []Write
	Clears []Clear
}

// Release is an allocation that no group owns any more.
type Release struct {
	Owner store.Owner
	Addrs []netip.Addr
}

// Announce is an address this node answers for, and the Services that
// have it.
type Announce struct {
	Addr     netip.Addr
	Services []*corev1.Service
}

// Answer is what one agent does with the store's allocations.
type Answer struct {
	Releases []Release
	// Wants go to the speaker, sorted by address.
	Wants []elect.Want
	// Announce are the wants this node is elected for.
	Announce []Announce
}

// group is the Services that share one address (or one Service alone).
type group struct {
	owner    store.Owner
	key      string // the writer's key
	ns       string
	services []*corev1.Service // oldest first
}

// accepted is a Service of a group that may have the group's address.
type accepted struct {
	svc      *corev1.Service
	eligible []string
}

// Key is the writer's key of a group: its owner in the store.
func Key(o store.Owner) string { return o.ContainerID + "/" + o.IfName }

// Ours says whether svc is a LoadBalancer Service Village serves.
func Ours(svc *corev1.Service, requireClass bool) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if cl := svc.Spec.LoadBalancerClass; cl != nil {
		return *cl == kubenames.LoadBalancerClassLAN
	}
	return !requireClass
}

// Plan computes the Events, the writes of the groups in's node writes and
// the Services it clears.
func (in *Input) Plan() Plan {
	var p Plan
	groups := in.groups(&p.Events)
	for _, g := range groups {
		if elect.Writer(g.key, in.Live) == in.Node {
			if w, ok := in.write(g, &p.Events); ok {
				p.Writes = append(p.Writes, w)
			}
		}
	}
	for _, svc := range in.Services {
		if Ours(svc, in.RequireClass) || svc.Annotations[kubenames.AnnotationLANAnnouncer] == "" ||
			elect.Writer(Key(alloc.ServiceOwner(svc.Namespace, svc.Name)), in.Live) != in.Node {
			continue
		}
		keep := Foreign(svc, in.InRanges)
		p.Clears = append(p.Clears, Clear{Service: svc, Ingress: keep, UpdateStatus: len(keep) != len(svc.Status.LoadBalancer.Ingress)})
	}
	return p
}

// Answer computes the releases, the wants and the announcements from
// in.Owners.
func (in *Input) Answer() Answer {
	var a Answer
	groups := in.groups(nil)
	wanted := map[store.Owner]*group{}
	for _, g := range groups {
		if in.allowed(g.ns) {
			wanted[g.owner] = g
		}
	}
	for o, ips := range in.Owners {
		if wanted[o] == nil && elect.Writer(Key(o), in.Live) == in.Node {
			a.Releases = append(a.Releases, Release{Owner: o, Addrs: ips})
		}
	}
	slices.SortFunc(a.Releases, func(x, y Release) int { return strings.Compare(Key(x.Owner), Key(y.Owner)) })
	for _, g := range groups {
		ips := in.Owners[g.owner]
		if wanted[g.owner] == nil || len(ips) == 0 {
			continue
		}
		acc := in.accept(g, nil)
		if len(acc) == 0 {
			continue
		}
		eligible := acc[0].eligible
		svcs := []*corev1.Service{acc[0].svc}
		for _, x := range acc[1:] {
			eligible = slices.DeleteFunc(eligible, func(n string) bool { return !slices.Contains(x.eligible, n) })
			svcs = append(svcs, x.svc)
		}
		for _, ip := range ips {
			a.Wants = append(a.Wants, elect.Want{Addr: ip, Eligible: eligible})
			if elect.Owner(ip, eligible, in.Alive) == in.Node {
				a.Announce = append(a.Announce, Announce{Addr: ip, Services: svcs})
			}
		}
	}
	slices.SortFunc(a.Wants, func(x, y elect.Want) int { return x.Addr.Compare(y.Addr) })
	return a
}

// groups gathers Village's Services into groups, sorted by key; an
// invalid share key is an Event in events (nil: not reported).
func (in *Input) groups(events *[]Event) []*group {
	byKey := map[string]*group{}
	for _, svc := range in.Services {
		if !Ours(svc, in.RequireClass) {
			continue
		}
		owner := alloc.ServiceOwner(svc.Namespace, svc.Name)
		if key := svc.Annotations[kubenames.AnnotationLANShare]; key != "" {
			if err := alloc.CheckShareKey(key); err != nil {
				report(events, svc, corev1.EventTypeWarning, kubenames.ReasonLANInvalid, fmt.Sprintf("annotation %s: %v", kubenames.AnnotationLANShare, err))
				continue
			}
			owner = alloc.ShareOwner(svc.Namespace, key)
		}
		k := Key(owner)
		g := byKey[k]
		if g == nil {
			g = &group{owner: owner, key: k, ns: svc.Namespace}
			byKey[k] = g
		}
		g.services = append(g.services, svc)
	}
	var out []*group
	for _, g := range byKey {
		slices.SortFunc(g.services, func(a, b *corev1.Service) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *group) int { return strings.Compare(a.key, b.key) })
	return out
}

func report(events *[]Event, svc *corev1.Service, typ, reason, msg string) {
	if events != nil {
		*events = append(*events, Event{Service: svc, Type: typ, Reason: reason, Message: msg})
	}
}

// allowed says whether namespace ns carries village.cni.io/lan=allowed.
func (in *Input) allowed(ns string) bool {
	for _, n := range in.Namespaces {
		if n.Name == ns {
			return n.Labels[kubenames.LabelLAN] == kubenames.LabelLANAllowed
		}
	}
	return false
}

type port struct {
	proto corev1.Protocol
	port  int32
}

func servicePorts(svc *corev1.Service) []port {
	var out []port
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		out = append(out, port{proto, p.Port})
	}
	return out
}

// accept is the group's Services that may have its address: the oldest
// first, each later one only if its ports do not clash with those taken
// and its lan-ip request (if any) is the group's. Each refusal is an
// Event in events (nil: not reported).
func (in *Input) accept(g *group, events *[]Event) []accepted {
	used := map[port]string{}
	var req string
	var out []accepted
	for _, svc := range g.services {
		if r := strings.TrimSpace(svc.Annotations[kubenames.AnnotationLANIP]); r != "" {
			if req == "" {
				req = r
			} else if r != req {
				report(events, svc, corev1.EventTypeWarning, kubenames.ReasonLANInvalid, fmt.Sprintf("annotation %s=%q differs from %q, which Service %s/%s sharing key %q asks for", kubenames.AnnotationLANIP, r, req, g.ns, out[0].svc.Name, svc.Annotations[kubenames.AnnotationLANShare]))
				continue
			}
		}
		clash := ""
		ps := servicePorts(svc)
		for _, p := range ps {
			if other, ok := used[p]; ok {
				clash = fmt.Sprintf("port %d/%s is Service %s/%s's on the shared address", p.port, p.proto, g.ns, other)
				break
			}
		}
		if clash != "" {
			report(events, svc, corev1.EventTypeWarning, kubenames.ReasonLANPortsClash, fmt.Sprintf("no LAN address: %s (%s %q)", clash, kubenames.AnnotationLANShare, svc.Annotations[kubenames.AnnotationLANShare]))
			continue
		}
		for _, p := range ps {
			used[p] = svc.Name
		}
		out = append(out, accepted{svc: svc, eligible: in.eligible(svc)})
	}
	return out
}

// write is the write of group g, with an Event for every refusal; false
// when there is nothing to write.
func (in *Input) write(g *group, events *[]Event) (Write, bool) {
	if !in.allowed(g.ns) {
		for _, svc := range g.services {
			report(events, svc, corev1.EventTypeWarning, kubenames.ReasonLANForbidden,
				fmt.Sprintf("no LAN address: namespace %s is not labelled %s=%s", g.ns, kubenames.LabelLAN, kubenames.LabelLANAllowed))
		}
		return Write{Owner: g.owner, Services: g.services, Forbidden: true}, true
	}
	acc := in.accept(g, events)
	if len(acc) == 0 {
		return Write{}, false
	}
	w := Write{Owner: g.owner, Request: alloc.Request{Owner: g.owner}, Held: in.Owners[g.owner]}
	req := &w.Request
	for _, a := range acc {
		w.Services = append(w.Services, a.svc)
		if r := strings.TrimSpace(a.svc.Annotations[kubenames.AnnotationLANIP]); r != "" && len(req.Addrs) == 0 {
			ips, err := netconf.ParseLANAddrs(r)
			if err != nil {
				for _, b := range acc {
					report(events, b.svc, corev1.EventTypeWarning, kubenames.ReasonLANInvalid, fmt.Sprintf("annotation %s: %v", kubenames.AnnotationLANIP, err))
				}
				return Write{}, false
			}
			req.Addrs = ips
		}
		for _, f := range a.svc.Spec.IPFamilies {
			if fam := protoFamily(f); !slices.Contains(req.Families, fam) {
				req.Families = append(req.Families, fam)
			}
		}
	}
	// A requested address decides the families: exactly those it names.
	// A family it does not name gets nothing, even one of the Service's
	// spec.ipFamilies: an address asked for and refused must not turn
	// into another address of the pool (a request for the router's IPv6
	// address on an IPv4 Service would otherwise be given a pool IPv4).
	if len(req.Addrs) > 0 {
		req.Families = nil
		for _, ip := range req.Addrs {
			if fam := addrFamily(ip); !slices.Contains(req.Families, fam) {
				req.Families = append(req.Families, fam)
			}
		}
	}
	return w, true
}

func protoFamily(f corev1.IPFamily) int {
	if f == corev1.IPv6Protocol {
		return 6
	}
	return 4
}

func addrFamily(ip netip.Addr) int {
	if ip.Is6() {
		return 6
	}
	return 4
}

// eligible lists the nodes that may answer for svc.
func (in *Input) eligible(svc *corev1.Service) []string {
	var out []string
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		for _, es := range in.EndpointSlices {
			if es.Namespace != svc.Namespace || es.Labels[discoveryv1.LabelServiceName] != svc.Name {
				continue
			}
			for _, ep := range es.Endpoints {
				if ep.NodeName != nil && *ep.NodeName != "" && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
					out = append(out, *ep.NodeName)
				}
			}
		}
	} else {
		for _, n := range in.Nodes {
			if _, excluded := n.Labels[kubenames.LabelExcludeFromLB]; excluded || !nodeReady(n) {
				continue
			}
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Foreign is svc's ingress entries that are not Village's: a hostname, or
// an address outside its ranges (another load balancer's, or a user's).
// Village never adds, changes or removes them, so it fights no other
// writer of the status.
func Foreign(svc *corev1.Service, inRanges func(netip.Addr) bool) []corev1.LoadBalancerIngress {
	var keep []corev1.LoadBalancerIngress
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(in.IP); in.Hostname != "" || err != nil || !inRanges(ip) {
			keep = append(keep, in)
		}
	}
	return keep
}

// Ingress is svc's status.loadBalancer.ingress with Village's part saying
// ips (ipMode VIP), after the foreign entries, which stay as they are;
// changed is false when the status says so already.
func Ingress(svc *corev1.Service, ips []netip.Addr, inRanges func(netip.Addr) bool) (ingress []corev1.LoadBalancerIngress, changed bool) {
	keep := Foreign(svc, inRanges)
	vip := corev1.LoadBalancerIPModeVIP
	var ours []corev1.LoadBalancerIngress
	for _, ip := range ips {
		ours = append(ours, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: &vip})
	}
	// Village's entries as they stand: what is not foreign (in order, so
	// a foreign entry written between them moves nothing).
	var have []corev1.LoadBalancerIngress
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if !slices.ContainsFunc(keep, func(k corev1.LoadBalancerIngress) bool { return equality.Semantic.DeepEqual(k, in) }) {
			have = append(have, in)
		}
	}
	if equality.Semantic.DeepEqual(have, ours) {
		return nil, false
	}
	return append(keep, ours...), true
}

// Refusal is the Event reason of the allocator's error err, and whether
// it is a refusal (an *alloc.Error) rather than a failing store.
func Refusal(err error) (reason string, refused bool) {
	reason = kubenames.ReasonLANFailed
	switch {
	case alloc.IsKind(err, alloc.Taken):
		reason = kubenames.ReasonLANTaken
	case alloc.IsKind(err, alloc.Outside):
		reason = kubenames.ReasonLANOutsidePool
	case alloc.IsKind(err, alloc.Exhausted), alloc.IsKind(err, alloc.NoRange):
		reason = kubenames.ReasonLANExhausted
	}
	var e *alloc.Error
	return reason, errors.As(err, &e)
}
