// Package kuberegistry is Village's node registry kept in the Kubernetes
// API instead of etcd: `villaged run` with backend.registry.type
// "kubernetes" reads this node's pod subnets from its Node object's
// spec.podCIDRs (assigned by kube-controller-manager, one per family),
// publishes its underlay address and VTEP MAC as annotations on that Node,
// and follows every Node with an informer (one list, then one watch),
// feeding each change as the one record it changes, in the registry.Node
// form the etcd registry uses, into a registry.Feed, so the agent
// reconciles both the same way.
//
// # Annotations
//
// Village owns the prefix "village.cni.io/" (the names: pkg/kubenames):
//
//	village.cni.io/underlay-ip   the node's underlay address (overlay endpoint / next hop)
//	village.cni.io/vtep-mac      the MAC of its VTEP (vxlan)
//	village.cni.io/wireguard-key the WireGuard public key (backend wireguard; removed otherwise)
//	village.cni.io/wireguard-endpoint  where peers send WireGuard, when configured
//
// and reads one label the admin sets: village.cni.io/wireguard-hub: "true"
// makes the node a WireGuard hub (registry.Node.Hub).
//
// A Node without the underlay-ip annotation or without spec.podCIDRs is
// not (yet) a peer. The agent writes only its own Node's annotations, with a
// JSON merge patch of the Node's status subresource, and writes them again when they differ from what it
// wants (changed or removed by hand): the informer's copy tells it, so a
// quiet cluster costs no request beyond the watch.
//
// Unlike the etcd registry there is no lease: a node leaves when its Node
// object is deleted (kubectl delete node, or the cloud controller), not
// when its agent stops.
package kuberegistry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/pkg/kubeconfig"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/registry"
)

// DefaultTimeout bounds one API request (the watch excepted).
const DefaultTimeout = 10 * time.Second

// retryEvery is the pause before writing the annotations again after a
// failed patch.
const retryEvery = 2 * time.Second

// ErrNoPodCIDR says the Node has no spec.podCIDRs yet.
var ErrNoPodCIDR = errors.New("no spec.podCIDRs yet")

// Config says how to reach the API server and which Node is this one.
type Config struct {
	// Kubeconfig is a kubeconfig file; "" means the in-cluster
	// configuration (the pod's service account).
	Kubeconfig string
	// Node is this node's Node name.
	Node string
	// Timeout bounds one request (DefaultTimeout when 0).
	Timeout time.Duration
	// Check is how often the agent compares its Node's annotations with
	// what it wants, from the informer's cache (no request); 0 means 30 s.
	// Watch events of its own Node are checked at once anyway.
	Check time.Duration
	// Resync is how often Run feeds the whole peer list again from the
	// informer's cache (no request), the repair of a change lost between
	// the informer and the feed's reader; 0 means DefaultResync.
	Resync time.Duration
	// Nodes is the agent's shared Node informer (with Slim as its
	// transform; the caller starts it); nil: Run makes and starts its own.
	Nodes cache.SharedIndexInformer
}

// DefaultResync is Config.Resync when 0.
const DefaultResync = time.Minute

// Registry reads Nodes and writes this node's annotations.
type Registry struct {
	cs   kubernetes.Interface
	cfg  Config
	host string
	// drop, when set (tests), loses the informer's events of the Nodes it
	// names, as a fault between the informer and the feed would.
	drop func(name string) bool
}

// New connects per cfg (no request is made yet).
func New(cfg Config) (*Registry, error) {
	rc, err := kubeconfig.REST(cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes registry: %w", err)
	}
	rc.UserAgent = kubenames.Agent
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes registry at %s: %w", rc.Host, err)
	}
	return NewForClient(cs, cfg, rc.Host), nil
}

// NewForClient uses an existing clientset; host names the API server in
// errors.
func NewForClient(cs kubernetes.Interface, cfg Config, host string) *Registry {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Check <= 0 {
		cfg.Check = 30 * time.Second
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	return &Registry{cs: cs, cfg: cfg, host: host}
}

// Where names the API server and this node's Node, for messages.
func (r *Registry) Where() string {
	return fmt.Sprintf("kubernetes API %s, Node %q", r.host, r.cfg.Node)
}

func (r *Registry) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("kubernetes API %s: %s: %w", r.host, what, err)
}

// PodCIDRs reads this node's pod subnets from its Node's spec.podCIDRs
// (spec.podCIDR when the list is empty). A Node without any answers an
// error wrapping ErrNoPodCIDR.
func (r *Registry) PodCIDRs(ctx context.Context) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	n, err := r.cs.CoreV1().Nodes().Get(ctx, r.cfg.Node, metav1.GetOptions{})
	if err != nil {
		return nil, r.wrap(fmt.Sprintf("reading Node %q", r.cfg.Node), err)
	}
	cidrs := podCIDRs(n)
	if len(cidrs) == 0 {
		return nil, fmt.Errorf("Node %q has %w (kube-controller-manager assigns them with --allocate-node-cidrs; or set spec.podCIDRs)", r.cfg.Node, ErrNoPodCIDR)
	}
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("Node %q: spec.podCIDRs entry %q: %w", r.cfg.Node, c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func podCIDRs(n *corev1.Node) []string {
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return nil
}

// Record is a Node as a registry record; ok is false when the Node is not
// a Village peer (no underlay-ip annotation or no pod subnets), err when it
// claims to be one but its annotations do not parse.
func Record(n *corev1.Node) (rec registry.Node, ok bool, err error) {
	ip := n.Annotations[kubenames.AnnotationUnderlayIP]
	cidrs := podCIDRs(n)
	if ip == "" || len(cidrs) == 0 {
		return rec, false, nil
	}
	rec = registry.Node{Name: n.Name, IP: ip, PodCIDRs: slices.Clone(cidrs), VtepMAC: n.Annotations[kubenames.AnnotationVtepMAC],
		WireGuardKey: n.Annotations[kubenames.AnnotationWireGuardKey], WireGuardEndpoint: n.Annotations[kubenames.AnnotationWireGuardEndpoint],
		Hub: n.Labels[kubenames.LabelWireGuardHub] == "true"}
	if err := rec.Validate(); err != nil {
		return rec, false, fmt.Errorf("Node %q: %w", n.Name, err)
	}
	return rec, true, nil
}

// annotations are the annotations that say rec, as a merge patch: an
// empty field removes its annotation (null).
func annotations(rec registry.Node) map[string]any {
	a := map[string]any{kubenames.AnnotationUnderlayIP: rec.IP, kubenames.AnnotationVtepMAC: rec.VtepMAC}
	for k, v := range map[string]string{kubenames.AnnotationWireGuardKey: rec.WireGuardKey, kubenames.AnnotationWireGuardEndpoint: rec.WireGuardEndpoint} {
		a[k] = v
		if v == "" {
			a[k] = nil
		}
	}
	return a
}

// annotated reports whether n's annotations say rec.
func annotated(n *corev1.Node, rec registry.Node) bool {
	for k, v := range annotations(rec) {
		have, ok := n.Annotations[k]
		if s, _ := v.(string); ok != (v != nil) || have != s {
			return false
		}
	}
	return true
}

// Nodes lists every Node that is a Village peer (one request), sorted by
// name; Nodes whose annotations do not parse are skipped and joined in bad.
func (r *Registry) Nodes(ctx context.Context) (nodes []registry.Node, rev int64, bad error, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	list, err := r.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, nil, r.wrap("listing Nodes", err)
	}
	var errs []error
	for i := range list.Items {
		rec, ok, err := Record(&list.Items[i])
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			nodes = append(nodes, rec)
		}
	}
	slices.SortFunc(nodes, func(a, b registry.Node) int { return strings.Compare(a.Name, b.Name) })
	rev, _ = strconv.ParseInt(list.ResourceVersion, 10, 64)
	return nodes, rev, errors.Join(errs...), nil
}

// Publish writes rec's annotations on this node's Node (one merge patch of
// nodes/status).
func (r *Registry) Publish(ctx context.Context, rec registry.Node) error {
	if rec.Name != r.cfg.Node {
		return fmt.Errorf("kubernetes registry of Node %q cannot publish Node %q", r.cfg.Node, rec.Name)
	}
	if err := rec.Validate(); err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations(rec)}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	// Through the status subresource, as flanneld does: it keeps the
	// patch's metadata and cannot change the Node's spec, so the agent's
	// identity needs no "patch" on Nodes themselves (rbac.yaml).
	_, err = r.cs.CoreV1().Nodes().Patch(ctx, r.cfg.Node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent}, "status")
	return r.wrap(fmt.Sprintf("annotating Node %q", r.cfg.Node), err)
}

// Slim keeps of a Node only what the registry reads (Village's
// annotations, the hub label, the pod subnets), so the informer's
// cache of a large cluster stays small: the transform of a Node informer
// given in Config.Nodes.
func Slim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	ann := map[string]string{}
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, kubenames.Prefix) {
			ann[k] = v
		}
	}
	var labels map[string]string
	if v, ok := n.Labels[kubenames.LabelWireGuardHub]; ok {
		labels = map[string]string{kubenames.LabelWireGuardHub: v}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Annotations: ann, Labels: labels},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
	}, nil
}

// Run keeps this node's annotations saying first (then the latest record
// from records) and keeps feed saying the peer Nodes until ctx is done: the
// informer's first list as one full batch, then each Node event as the one
// record it changes (a Node that stops being a peer, or whose annotations
// no longer parse, is removed), so the reader's work per event does not
// grow with the cluster. An update that leaves a Node's record as it was
// (status, labels, other annotations) is not fed at all. Every
// Config.Resync the whole list is fed again from the informer's cache (no
// request): a change lost or delivered out of order between the informer
// and the reader is repaired then. The informer relists and rewatches by
// itself when the API server goes away and comes back.
func (r *Registry) Run(ctx context.Context, first registry.Node, records <-chan registry.Node, feed *registry.Feed, logf func(string, ...any)) {
	inf := r.cfg.Nodes
	var factory informers.SharedInformerFactory
	if inf == nil {
		factory = informers.NewSharedInformerFactoryWithOptions(r.cs, 0, informers.WithTransform(Slim))
		inf = factory.Core().V1().Nodes().Informer()
	}
	own := make(chan struct{}, 1)
	h := &handler{r: r, feed: feed, own: own, logf: logf}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: h.add, UpdateFunc: h.update, DeleteFunc: h.delete})
	if err != nil {
		logf("kubernetes registry: %v", err)
		return
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	if factory != nil {
		factory.Start(ctx.Done())
		defer factory.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return
	}
	feed.Open()
	want := first
	var retry <-chan time.Time
	check := time.NewTicker(r.cfg.Check)
	defer check.Stop()
	resync := time.NewTicker(r.cfg.Resync)
	defer resync.Stop()
	ensure := func() {
		retry = nil
		obj, exists, err := inf.GetStore().GetByKey(r.cfg.Node)
		if err != nil || !exists {
			logf("kubernetes registry: Node %q does not exist (retrying in %s)", r.cfg.Node, retryEvery)
			retry = time.After(retryEvery)
			return
		}
		n := obj.(*corev1.Node)
		if annotated(n, want) {
			return
		}
		if err := r.Publish(ctx, want); err != nil {
			if ctx.Err() == nil {
				logf("%v (retrying in %s)", err, retryEvery)
				retry = time.After(retryEvery)
			}
			return
		}
		var wg string
		if want.WireGuardKey != "" {
			wg = fmt.Sprintf(" %s=%s", kubenames.AnnotationWireGuardKey, want.WireGuardKey)
		}
		logf("annotated Node %q: %s=%s %s=%s%s", r.cfg.Node, kubenames.AnnotationUnderlayIP, want.IP, kubenames.AnnotationVtepMAC, want.VtepMAC, wg)
	}
	ensure()
	for {
		select {
		case <-ctx.Done():
			return
		case want = <-records:
			ensure()
		case <-retry:
			ensure()
		case <-check.C:
			ensure()
		case <-own:
			ensure()
		case <-resync.C:
			h.resync(inf.GetStore())
		}
	}
}

// handler turns the informer's events into the feed's puts and removals.
// The informer calls it from one goroutine; resync runs on Run's.
type handler struct {
	r    *Registry
	feed *registry.Feed
	own  chan struct{} // this node's Node changed
	logf func(string, ...any)
}

func (h *handler) add(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	h.feedNode(n)
}

func (h *handler) update(old, obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	if o, ok := old.(*corev1.Node); ok && sameRecord(o, n) {
		h.ownChanged(n.Name)
		return
	}
	h.feedNode(n)
}

func (h *handler) delete(obj any) {
	m, err := metaOf(obj)
	if err != nil {
		return
	}
	if h.r.drop != nil && h.r.drop(m.GetName()) {
		return
	}
	h.feed.Remove(m.GetName(), revOf(m))
	h.ownChanged(m.GetName())
}

// feedNode puts n's record, or removes its name when n is not a peer.
func (h *handler) feedNode(n *corev1.Node) {
	defer h.ownChanged(n.Name)
	if h.r.drop != nil && h.r.drop(n.Name) {
		return
	}
	rec, ok, err := Record(n)
	if err != nil {
		h.logf("kubernetes registry: skipping %v", err)
	}
	if !ok {
		h.feed.Remove(n.Name, revOf(n))
		return
	}
	h.feed.Put(rec, revOf(n))
}

func (h *handler) ownChanged(name string) {
	if name != h.r.cfg.Node {
		return
	}
	select {
	case h.own <- struct{}{}:
	default:
	}
}

// resync feeds the whole peer list of the informer's cache again.
func (h *handler) resync(store cache.Store) {
	var nodes []registry.Node
	var rev int64
	for _, obj := range store.List() {
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		rev = max(rev, revOf(n))
		if rec, ok, _ := Record(n); ok {
			nodes = append(nodes, rec)
		}
	}
	h.feed.Reset(nodes, rev)
}

// sameRecord reports whether two versions of a Node say the same record
// (or are both no peer).
func sameRecord(a, b *corev1.Node) bool {
	ra, oka, erra := Record(a)
	rb, okb, errb := Record(b)
	return oka == okb && (erra == nil) == (errb == nil) && (!oka || ra.Equal(rb))
}

func revOf(m metav1.Object) int64 {
	v, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
	return v
}

func metaOf(obj any) (metav1.Object, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("not an object: %T", obj)
	}
	return m, nil
}
