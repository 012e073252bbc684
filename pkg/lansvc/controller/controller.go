// Package controller is villaged's LAN Services controller
// ("macvlan.services"): it gives LoadBalancer Services addresses on the
// LAN and tells the speaker (pkg/lansvc/speaker) which nodes may answer
// for each.
//
// It reads only the agent's shared informers (Services, EndpointSlices,
// Nodes, Namespaces) and recomputes everything in one pass, on any change
// (coalesced) and every Resync:
//
//   - A Service is Village's when it is type LoadBalancer with
//     spec.loadBalancerClass village.cni.io/lan, or with no class unless
//     requireClass. Services with one village.cni.io/lan-share key in one
//     namespace form one group (one address); any other is a group alone.
//   - One writer per group: the live agent (members over the LAN, plus
//     this one) with the highest rendezvous score for the group's key
//     (elect.Writer). Only it allocates (pkg/lansvc/alloc, in the LAN
//     pool's store), writes status.loadBalancer.ingress (ipMode VIP) and
//     the refusal Events. While the agents' views differ for a moment two
//     may write: the store's claim is a compare-and-swap (the group ends
//     with one address) and the status update carries the informer's
//     resourceVersion (a stale write is refused and retried next pass).
//   - The writer releases the addresses of groups that are gone (deleted,
//     no longer LoadBalancer, another class, namespace no longer allowed).
//   - Every agent reads the groups' addresses from the store (never from
//     a Service's status or annotations, which users can write), computes
//     the eligible nodes (externalTrafficPolicy Local: nodes with a ready
//     endpoint in the EndpointSlices; Cluster: Ready nodes without
//     node.kubernetes.io/exclude-from-external-load-balancers; a group
//     takes the nodes eligible for all its Services) and hands them to the
//     speaker. The agent that answers for an address writes the
//     village.cni.io/lan-announcer annotation and an Event naming the
//     address and the node.
//
// When the API server is unreachable no pass changes anything: the
// speaker keeps the last wants, and failover goes on through the gossip.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/netconf"
)

// DefaultResync is the period of the backstop pass.
const DefaultResync = 10 * time.Second

// eventEvery is how often the same Event is written again while its cause
// lasts.
const eventEvery = 5 * time.Minute

// Speaker is what the controller needs of pkg/lansvc/speaker.
type Speaker interface {
	SetWants(w []elect.Want)
}

// Config is what a Controller works with: the agent's Kubernetes side,
// passed in narrow (the informers, the clientset, the one recorder).
type Config struct {
	Node   string
	Client kubernetes.Interface
	// The agent's shared informers, started by the agent.
	Services, EndpointSlices, Nodes, Namespaces cache.SharedIndexInformer
	Events                                      record.EventRecorder
	// Alloc allocates in the LAN pool's store.
	Alloc        *alloc.Allocator
	RequireClass bool
	// Live lists the live agents (members.Live, this one included); nil
	// means this node alone. Alive says whether one is (members.Alive).
	Live  func() []string
	Alive func(node string) bool
	// Settled says whether the members' view can be trusted (members.
	// Settled): the announcer annotation is written only then, as the
	// speaker claims only then. nil means always.
	Settled func() bool
	// Speaker gets the wants; nil: none (tests).
	Speaker Speaker
	// Holds says whether this node answers for an address now
	// (announce.Announcer.Holds): the announcer annotation is written
	// only then. InUseBy is the MAC that answers for it instead, nil
	// when none does: the Service then gets a Warning Event. nil: the
	// election's word is taken (tests).
	Holds   func(netip.Addr) bool
	InUseBy func(netip.Addr) net.HardwareAddr
	Resync  time.Duration // 0: DefaultResync
	Logf    func(string, ...any)
}

// Controller is the LAN Services controller of one agent.
type Controller struct {
	cfg  Config
	kick chan struct{}

	mu     sync.Mutex
	events map[said]saying // the last Event of each reason on each Service
	wants  []elect.Want
	known  bool // a pass has computed wants from synced informers
}

// New makes the controller and adds its handlers to the informers.
func New(cfg Config) (*Controller, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Live == nil {
		cfg.Live = func() []string { return []string{cfg.Node} }
	}
	if cfg.Alive == nil {
		cfg.Alive = func(n string) bool { return n == cfg.Node }
	}
	c := &Controller{cfg: cfg, kick: make(chan struct{}, 1), events: map[said]saying{}}
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.Kick() }, UpdateFunc: func(any, any) { c.Kick() }, DeleteFunc: func(any) { c.Kick() }}
	for _, inf := range []cache.SharedIndexInformer{cfg.Services, cfg.EndpointSlices, cfg.Nodes, cfg.Namespaces} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("LAN Services: %w", err)
		}
	}
	return c, nil
}

// Kick asks for a pass (the members changed, say). It never blocks.
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run makes passes until ctx is done, the first once the informers have
// synced.
func (c *Controller) Run(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), c.cfg.Services.HasSynced, c.cfg.EndpointSlices.HasSynced, c.cfg.Nodes.HasSynced, c.cfg.Namespaces.HasSynced) {
		return
	}
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	for {
		c.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
			// Coalesce a burst of events into one pass.
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		case <-t.C:
		}
	}
}

// Wants are the last wants handed to the speaker.
func (c *Controller) Wants() []elect.Want {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.wants)
}

// Known reports whether Wants come from a pass over synced informers and
// the store (false until the first such pass: the wants are not known
// yet, whatever Wants says).
func (c *Controller) Known() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.known
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

func (c *Controller) pass(ctx context.Context) {
	live := c.cfg.Live()
	groups := c.groups()
	uids := map[ktypes.UID]bool{}
	for _, obj := range c.cfg.Services.GetStore().List() {
		if svc, ok := obj.(*corev1.Service); ok {
			uids[svc.UID] = true
		}
	}
	c.forget(uids)
	// One read of the store per pass while nothing changes: a group whose
	// owner already holds what it asks for costs no further request.
	owners, err := c.cfg.Alloc.Owners(ctx)
	if err != nil {
		c.cfg.Logf("LAN Services: %v", err)
		return
	}
	changed := false
	for _, g := range groups {
		if elect.Writer(g.key, live) == c.cfg.Node {
			changed = c.write(ctx, g, owners[g.owner]) || changed
		}
	}
	c.clearFormer(ctx, live)
	if changed {
		if owners, err = c.cfg.Alloc.Owners(ctx); err != nil {
			c.cfg.Logf("LAN Services: %v", err)
			return
		}
	}
	// Release what no group (in an allowed namespace) owns any more.
	wanted := map[store.Owner]*group{}
	for _, g := range groups {
		if c.allowed(g.ns) {
			wanted[g.owner] = g
		}
	}
	for o, ips := range owners {
		if wanted[o] == nil && elect.Writer(ownerKey(o), live) == c.cfg.Node {
			if _, err := c.cfg.Alloc.Release(ctx, o); err != nil {
				c.cfg.Logf("LAN Services: %v", err)
				continue
			}
			c.cfg.Logf("LAN Services: released %v of %s (no such LoadBalancer Service any more)", ips, o.ContainerID)
		}
	}
	var wants []elect.Want
	var mine []announce
	for _, g := range groups {
		ips := owners[g.owner]
		if wanted[g.owner] == nil || len(ips) == 0 {
			continue
		}
		acc := c.accept(g, false)
		if len(acc) == 0 {
			continue
		}
		eligible := acc[0].eligible
		for _, a := range acc[1:] {
			eligible = slices.DeleteFunc(eligible, func(n string) bool { return !slices.Contains(a.eligible, n) })
		}
		for _, ip := range ips {
			wants = append(wants, elect.Want{Addr: ip, Eligible: eligible})
			if elect.Owner(ip, eligible, c.cfg.Alive) == c.cfg.Node {
				mine = append(mine, announce{ip: ip, acc: acc})
			}
		}
	}
	slices.SortFunc(wants, func(a, b elect.Want) int { return a.Addr.Compare(b.Addr) })
	c.mu.Lock()
	c.wants, c.known = wants, true
	c.mu.Unlock()
	if c.cfg.Speaker != nil {
		c.cfg.Speaker.SetWants(wants)
	}
	if c.cfg.Settled != nil && !c.cfg.Settled() {
		return
	}
	for _, m := range mine {
		if c.cfg.Holds != nil && !c.cfg.Holds(m.ip) {
			var mac net.HardwareAddr
			if c.cfg.InUseBy != nil {
				mac = c.cfg.InUseBy(m.ip)
			}
			if mac != nil {
				for _, a := range m.acc {
					c.contested(ctx, a.svc, m.ip, mac)
				}
			}
			continue // probing still, or contested
		}
		for _, a := range m.acc {
			c.markAnnouncer(ctx, a.svc, m.ip)
		}
	}
}

// contested reports on svc that mac, not this node, answers for ip: a
// Warning Event, and the announcer annotation removed if it names this
// node.
func (c *Controller) contested(ctx context.Context, svc *corev1.Service, ip netip.Addr, mac net.HardwareAddr) {
	c.event(svc, corev1.EventTypeWarning, kubenames.ReasonLANAddressInUse,
		fmt.Sprintf("address %s in use by MAC %s: node %s, elected for it, does not answer (another cluster with an overlapping range, or a host that took it)", ip, mac, c.cfg.Node))
	if svc.Annotations[kubenames.AnnotationLANAnnouncer] != c.cfg.Node {
		return
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{kubenames.AnnotationLANAnnouncer: nil}}})
	if _, err := c.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent}); err != nil {
		c.cfg.Logf("LAN Services: announcer of %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

type announce struct {
	ip  netip.Addr
	acc []accepted
}

// clearFormer removes what Village wrote on Services that are no longer
// its own (no longer type LoadBalancer): the ingress addresses from its
// ranges and the announcer annotation. Their writer is the old single
// Service group's.
func (c *Controller) clearFormer(ctx context.Context, live []string) {
	for _, obj := range c.cfg.Services.GetStore().List() {
		svc, ok := obj.(*corev1.Service)
		if !ok || c.ours(svc) || svc.Annotations[kubenames.AnnotationLANAnnouncer] == "" ||
			elect.Writer(ownerKey(alloc.ServiceOwner(svc.Namespace, svc.Name)), live) != c.cfg.Node {
			continue
		}
		keep := c.foreign(svc)
		if len(keep) != len(svc.Status.LoadBalancer.Ingress) {
			c.updateStatus(ctx, svc, keep)
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{kubenames.AnnotationLANAnnouncer: nil}}})
		if _, err := c.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent}); err != nil && !apierrors.IsNotFound(err) {
			c.cfg.Logf("LAN Services: announcer of %s/%s: %v", svc.Namespace, svc.Name, err)
		}
	}
}

// ownerKey is the writer's key of a group: its owner in the store.
func ownerKey(o store.Owner) string { return o.ContainerID + "/" + o.IfName }

// ours says whether svc is a LoadBalancer Service Village serves.
func (c *Controller) ours(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if cl := svc.Spec.LoadBalancerClass; cl != nil {
		return *cl == kubenames.LoadBalancerClassLAN
	}
	return !c.cfg.RequireClass
}

// groups gathers Village's Services into groups, sorted by key.
func (c *Controller) groups() []*group {
	byKey := map[string]*group{}
	for _, obj := range c.cfg.Services.GetStore().List() {
		svc, ok := obj.(*corev1.Service)
		if !ok || !c.ours(svc) {
			continue
		}
		owner := alloc.ServiceOwner(svc.Namespace, svc.Name)
		if key := svc.Annotations[kubenames.AnnotationLANShare]; key != "" {
			if err := alloc.CheckShareKey(key); err != nil {
				c.event(svc, corev1.EventTypeWarning, kubenames.ReasonLANInvalid, fmt.Sprintf("annotation %s: %v", kubenames.AnnotationLANShare, err))
				continue
			}
			owner = alloc.ShareOwner(svc.Namespace, key)
		}
		k := ownerKey(owner)
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

// allowed says whether namespace ns carries village.cni.io/lan=allowed.
func (c *Controller) allowed(ns string) bool {
	obj, ok, err := c.cfg.Namespaces.GetStore().GetByKey(ns)
	if err != nil || !ok {
		return false
	}
	n, ok := obj.(*corev1.Namespace)
	return ok && n.Labels[kubenames.LabelLAN] == kubenames.LabelLANAllowed
}

// accept is the group's Services that may have its address: the oldest
// first, each later one only if its ports do not clash with those taken
// and its lan-ip request (if any) is the group's. With report, each
// refusal is an Event.
func (c *Controller) accept(g *group, report bool) []accepted {
	type port struct {
		proto corev1.Protocol
		port  int32
	}
	used := map[port]string{}
	var req string
	var out []accepted
	for _, svc := range g.services {
		if r := strings.TrimSpace(svc.Annotations[kubenames.AnnotationLANIP]); r != "" {
			if req == "" {
				req = r
			} else if r != req {
				if report {
					c.event(svc, corev1.EventTypeWarning, kubenames.ReasonLANInvalid, fmt.Sprintf("annotation %s=%q differs from %q, which Service %s/%s sharing key %q asks for", kubenames.AnnotationLANIP, r, req, g.ns, out[0].svc.Name, svc.Annotations[kubenames.AnnotationLANShare]))
				}
				continue
			}
		}
		clash := ""
		for _, p := range svc.Spec.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			if other, ok := used[port{proto, p.Port}]; ok {
				clash = fmt.Sprintf("port %d/%s is Service %s/%s's on the shared address", p.Port, proto, g.ns, other)
				break
			}
		}
		if clash != "" {
			if report {
				c.event(svc, corev1.EventTypeWarning, kubenames.ReasonLANPortsClash, fmt.Sprintf("no LAN address: %s (%s %q)", clash, kubenames.AnnotationLANShare, svc.Annotations[kubenames.AnnotationLANShare]))
			}
			continue
		}
		for _, p := range svc.Spec.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			used[port{proto, p.Port}] = svc.Name
		}
		out = append(out, accepted{svc: svc, eligible: c.eligible(svc)})
	}
	return out
}

// write allocates the group's address (unless held already holds what it
// asks for) and writes its Services' status, with an Event for every
// refusal. It reports whether it asked the store for anything.
func (c *Controller) write(ctx context.Context, g *group, held []netip.Addr) bool {
	if !c.allowed(g.ns) {
		for _, svc := range g.services {
			c.event(svc, corev1.EventTypeWarning, kubenames.ReasonLANForbidden,
				fmt.Sprintf("no LAN address: namespace %s is not labelled %s=%s", g.ns, kubenames.LabelLAN, kubenames.LabelLANAllowed))
			c.setStatus(ctx, svc, nil)
		}
		return false
	}
	acc := c.accept(g, true)
	if len(acc) == 0 {
		return false
	}
	req := alloc.Request{Owner: g.owner}
	for _, a := range acc {
		if r := strings.TrimSpace(a.svc.Annotations[kubenames.AnnotationLANIP]); r != "" && len(req.Addrs) == 0 {
			ips, err := netconf.ParseLANAddrs(r)
			if err != nil {
				for _, b := range acc {
					c.event(b.svc, corev1.EventTypeWarning, kubenames.ReasonLANInvalid, fmt.Sprintf("annotation %s: %v", kubenames.AnnotationLANIP, err))
				}
				return false
			}
			req.Addrs = ips
		}
		for _, f := range a.svc.Spec.IPFamilies {
			fam := 4
			if f == corev1.IPv6Protocol {
				fam = 6
			}
			if !slices.Contains(req.Families, fam) {
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
			fam := 4
			if ip.Is6() {
				fam = 6
			}
			if !slices.Contains(req.Families, fam) {
				req.Families = append(req.Families, fam)
			}
		}
	}
	ips, asked := held, false
	var err error
	if !c.cfg.Alloc.Holds(held, req) {
		ips, err = c.cfg.Alloc.Ensure(ctx, req)
		asked = true
	}
	if err != nil {
		reason := kubenames.ReasonLANFailed
		switch {
		case alloc.IsKind(err, alloc.Taken):
			reason = kubenames.ReasonLANTaken
		case alloc.IsKind(err, alloc.Outside):
			reason = kubenames.ReasonLANOutsidePool
		case alloc.IsKind(err, alloc.Exhausted), alloc.IsKind(err, alloc.NoRange):
			reason = kubenames.ReasonLANExhausted
		}
		for _, a := range acc {
			c.event(a.svc, corev1.EventTypeWarning, reason, err.Error())
		}
		var refusal *alloc.Error
		if !errors.As(err, &refusal) {
			c.cfg.Logf("LAN Services: %s: %v", g.owner.ContainerID, err)
			return asked // the store failed: leave the status as it is
		}
	}
	for _, a := range acc {
		if c.setStatus(ctx, a.svc, ips) && len(ips) > 0 {
			c.event(a.svc, corev1.EventTypeNormal, kubenames.ReasonLANAssigned, fmt.Sprintf("LAN address %s", join(ips)))
		}
	}
	return asked
}

func join(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ",")
}

// foreign is svc's ingress entries that are not Village's: a hostname, or
// an address outside its ranges (another load balancer's, or a user's).
// Village never adds, changes or removes them, so it fights no other
// writer of the status.
func (c *Controller) foreign(svc *corev1.Service) []corev1.LoadBalancerIngress {
	var keep []corev1.LoadBalancerIngress
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(in.IP); in.Hostname != "" || err != nil || !c.cfg.Alloc.InRanges(ip) {
			keep = append(keep, in)
		}
	}
	return keep
}

// setStatus makes Village's part of svc's status.loadBalancer.ingress say
// ips (ipMode VIP), after the foreign entries, which stay as they are, and
// reports whether it changed it.
func (c *Controller) setStatus(ctx context.Context, svc *corev1.Service, ips []netip.Addr) bool {
	keep := c.foreign(svc)
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
	if sameIngress(have, ours) {
		return false
	}
	return c.updateStatus(ctx, svc, append(keep, ours...))
}

// updateStatus writes ingress as svc's status.loadBalancer.ingress, with
// the informer's resourceVersion (a stale object is refused, and the next
// pass sees the new one).
func (c *Controller) updateStatus(ctx context.Context, svc *corev1.Service, want []corev1.LoadBalancerIngress) bool {
	cp := svc.DeepCopy()
	cp.Status.LoadBalancer.Ingress = want
	_, err := c.cfg.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{FieldManager: kubenames.Agent})
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		c.Kick() // another writer or a newer object: the next pass sees it
		return false
	case err != nil:
		c.cfg.Logf("LAN Services: status of %s/%s: %v", svc.Namespace, svc.Name, err)
		return false
	}
	return true
}

func sameIngress(a, b []corev1.LoadBalancerIngress) bool {
	return equality.Semantic.DeepEqual(a, b)
}

// eligible lists the nodes that may answer for svc.
func (c *Controller) eligible(svc *corev1.Service) []string {
	var out []string
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		for _, obj := range c.cfg.EndpointSlices.GetStore().List() {
			es, ok := obj.(*discoveryv1.EndpointSlice)
			if !ok || es.Namespace != svc.Namespace || es.Labels[discoveryv1.LabelServiceName] != svc.Name {
				continue
			}
			for _, ep := range es.Endpoints {
				if ep.NodeName != nil && *ep.NodeName != "" && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
					out = append(out, *ep.NodeName)
				}
			}
		}
	} else {
		for _, obj := range c.cfg.Nodes.GetStore().List() {
			n, ok := obj.(*corev1.Node)
			if !ok {
				continue
			}
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

// markAnnouncer writes village.cni.io/lan-announcer on svc (this node)
// and an Event naming the address, when it says otherwise.
func (c *Controller) markAnnouncer(ctx context.Context, svc *corev1.Service, ip netip.Addr) {
	if svc.Annotations[kubenames.AnnotationLANAnnouncer] == c.cfg.Node {
		return
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kubenames.AnnotationLANAnnouncer: c.cfg.Node}}})
	_, err := c.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent})
	if err != nil {
		c.cfg.Logf("LAN Services: announcer of %s/%s: %v", svc.Namespace, svc.Name, err)
		return
	}
	c.event(svc, corev1.EventTypeNormal, kubenames.ReasonLANAnnounced, fmt.Sprintf("node %s answers for %s on the LAN", c.cfg.Node, ip))
}

// event records an Event on svc, unless the last one of the same reason
// on it said the same less than eventEvery ago.
func (c *Controller) event(svc *corev1.Service, typ, reason, msg string) {
	k := said{uid: svc.UID, reason: reason}
	now := time.Now()
	c.mu.Lock()
	last, ok := c.events[k]
	if ok && last.msg == msg && now.Sub(last.at) < eventEvery {
		c.mu.Unlock()
		return
	}
	c.events[k] = saying{msg: msg, at: now}
	c.mu.Unlock()
	c.cfg.Events.Event(svc, typ, reason, msg)
	c.cfg.Logf("LAN Services: %s/%s: %s: %s", svc.Namespace, svc.Name, reason, msg)
}

// forget drops the Events remembered for Services that are gone.
func (c *Controller) forget(keep map[ktypes.UID]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.events {
		if !keep[k.uid] {
			delete(c.events, k)
		}
	}
}

type said struct {
	uid    ktypes.UID
	reason string
}

type saying struct {
	msg string
	at  time.Time
}
