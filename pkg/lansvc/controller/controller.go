// Package controller is villaged's LAN Services controller
// ("macvlan.services"): it gives LoadBalancer Services addresses on the
// LAN and tells the speaker (pkg/lansvc/speaker) which nodes may answer
// for each.
//
// It is the informer glue and the writes around the pure core,
// pkg/lansvc/plan, which says what to do (its package comment has the
// rules). It reads only the agent's shared informers (Services,
// EndpointSlices, Nodes, Namespaces) and the LAN pool's store, and makes
// one pass on any change (coalesced) and every Resync: it lists them,
// records the plan's Events, allocates (pkg/lansvc/alloc) and writes
// status.loadBalancer.ingress (ipMode VIP) for the groups this agent
// writes, clears what Village wrote on Services no longer its own, reads
// the store again, releases the gone groups' addresses, hands the wants
// to the speaker, and writes the village.cni.io/lan-announcer annotation
// and an Event on the Services whose address this node answers for.
//
// While the agents' views differ for a moment two may write: the store's
// claim is a compare-and-swap (the group ends with one address) and the
// status update carries the informer's resourceVersion (a stale write is
// refused and retried next pass). When the API server is unreachable no
// pass changes anything: the speaker keeps the last wants, and failover
// goes on through the gossip.
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/alloc"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/lansvc/plan"
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

// input is the pure core's picture of the informers, with no
// allocations yet.
func (c *Controller) input() *plan.Input {
	in := &plan.Input{Node: c.cfg.Node, RequireClass: c.cfg.RequireClass, Live: c.cfg.Live(), Alive: c.cfg.Alive, InRanges: c.cfg.Alloc.InRanges,
		Services: list[*corev1.Service](c.cfg.Services), EndpointSlices: list[*discoveryv1.EndpointSlice](c.cfg.EndpointSlices),
		Nodes: list[*corev1.Node](c.cfg.Nodes), Namespaces: list[*corev1.Namespace](c.cfg.Namespaces)}
	return in
}

// list is the objects of type T in inf's store.
func list[T any](inf cache.SharedIndexInformer) []T {
	var out []T
	for _, obj := range inf.GetStore().List() {
		if o, ok := obj.(T); ok {
			out = append(out, o)
		}
	}
	return out
}

// pass lists the informers and the store, and does what the pure core
// (pkg/lansvc/plan) says: the Events and writes first, then, from the
// store read again when they changed it, the releases, the speaker's
// wants and the announcer annotations.
func (c *Controller) pass(ctx context.Context) {
	in := c.input()
	c.forget(in.Services)
	// One read of the store per pass while nothing changes: a group whose
	// owner already holds what it asks for costs no further request.
	var err error
	if in.Owners, err = c.cfg.Alloc.Owners(ctx); err != nil {
		c.cfg.Logf("LAN Services: %v", err)
		return
	}
	p := in.Plan()
	for _, e := range p.Events {
		c.event(e.Service, e.Type, e.Reason, e.Message)
	}
	changed := false
	for _, w := range p.Writes {
		changed = c.write(ctx, w) || changed
	}
	for _, cl := range p.Clears {
		c.clear(ctx, cl)
	}
	if changed {
		if in.Owners, err = c.cfg.Alloc.Owners(ctx); err != nil {
			c.cfg.Logf("LAN Services: %v", err)
			return
		}
	}
	a := in.Answer()
	for _, r := range a.Releases {
		if _, err := c.cfg.Alloc.Release(ctx, r.Owner); err != nil {
			c.cfg.Logf("LAN Services: %v", err)
			continue
		}
		c.cfg.Logf("LAN Services: released %v of %s (no such LoadBalancer Service any more)", r.Addrs, r.Owner.ContainerID)
	}
	c.mu.Lock()
	c.wants, c.known = a.Wants, true
	c.mu.Unlock()
	if c.cfg.Speaker != nil {
		c.cfg.Speaker.SetWants(a.Wants)
	}
	if c.cfg.Settled != nil && !c.cfg.Settled() {
		return
	}
	for _, m := range a.Announce {
		if c.cfg.Holds != nil && !c.cfg.Holds(m.Addr) {
			var mac net.HardwareAddr
			if c.cfg.InUseBy != nil {
				mac = c.cfg.InUseBy(m.Addr)
			}
			if mac != nil {
				for _, svc := range m.Services {
					c.contested(ctx, svc, m.Addr, mac)
				}
			}
			continue // probing still, or contested
		}
		for _, svc := range m.Services {
			c.markAnnouncer(ctx, svc, m.Addr)
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
	if err := c.unannounce(ctx, svc); err != nil {
		c.cfg.Logf("LAN Services: announcer of %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

// unannounce removes the announcer annotation from svc.
func (c *Controller) unannounce(ctx context.Context, svc *corev1.Service) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{kubenames.AnnotationLANAnnouncer: nil}}})
	_, err := c.cfg.Client.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent})
	return err
}

// clear removes what Village wrote on a Service that is no longer its
// own: the ingress addresses from its ranges and the announcer
// annotation.
func (c *Controller) clear(ctx context.Context, cl plan.Clear) {
	svc := cl.Service
	if cl.UpdateStatus {
		c.updateStatus(ctx, svc, cl.Ingress)
	}
	if err := c.unannounce(ctx, svc); err != nil && !apierrors.IsNotFound(err) {
		c.cfg.Logf("LAN Services: announcer of %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

// write allocates the group's address (unless it already holds what it
// asks for) and writes its Services' status, with an Event for every
// refusal. It reports whether it asked the store for anything.
func (c *Controller) write(ctx context.Context, w plan.Write) bool {
	if w.Forbidden {
		for _, svc := range w.Services {
			c.setStatus(ctx, svc, nil)
		}
		return false
	}
	ips, asked := w.Held, false
	var err error
	if !c.cfg.Alloc.Holds(w.Held, w.Request) {
		ips, err = c.cfg.Alloc.Ensure(ctx, w.Request)
		asked = true
	}
	if err != nil {
		reason, refused := plan.Refusal(err)
		for _, svc := range w.Services {
			c.event(svc, corev1.EventTypeWarning, reason, err.Error())
		}
		if !refused {
			c.cfg.Logf("LAN Services: %s: %v", w.Owner.ContainerID, err)
			return asked // the store failed: leave the status as it is
		}
	}
	for _, svc := range w.Services {
		if c.setStatus(ctx, svc, ips) && len(ips) > 0 {
			c.event(svc, corev1.EventTypeNormal, kubenames.ReasonLANAssigned, fmt.Sprintf("LAN address %s", join(ips)))
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

// setStatus makes Village's part of svc's status.loadBalancer.ingress say
// ips and reports whether it changed it.
func (c *Controller) setStatus(ctx context.Context, svc *corev1.Service, ips []netip.Addr) bool {
	want, changed := plan.Ingress(svc, ips, c.cfg.Alloc.InRanges)
	return changed && c.updateStatus(ctx, svc, want)
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
func (c *Controller) forget(svcs []*corev1.Service) {
	keep := map[ktypes.UID]bool{}
	for _, svc := range svcs {
		keep[svc.UID] = true
	}
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
