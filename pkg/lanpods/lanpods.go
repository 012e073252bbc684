package lanpods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netconf"
)

// lanWait bounds how long a lookup waits for a pod the agent has not seen
// yet (after one direct read of the API missed it too); then the ADD fails
// with CNI code 11 and kubelet retries the sandbox.
const lanWait = 10 * time.Second

// eventEvery is how often the same Event (pod, reason, message) is written
// again while kubelet keeps retrying the same failed ADD.
const eventEvery = time.Minute

// Config is what a Controller works with: the agent's Kubernetes side,
// passed in narrow (kube-router's pattern): the clientset for the few
// direct requests, the shared informers, the agent's one Event recorder.
type Config struct {
	Network string
	Node    string
	// Client reads a pod or namespace the informers have not seen and
	// writes the annotation; nil: no API access (APIErr says why), and
	// every lookup of a Kubernetes pod fails saying so.
	Client kubernetes.Interface
	APIErr error
	// Pods (this node's pods at least: a cluster-wide informer serves too)
	// and Namespaces are the agent's shared informers, started by the
	// agent; nil when the network's pods are not "annotated" (then a
	// lookup is refused).
	Pods, Namespaces cache.SharedIndexInformer
	// Events records the Warnings on pods (the agent's one recorder).
	Events record.EventRecorder
	// IfName is the pods' LAN interface (macvlan.ifName).
	IfName string
	// All: the network gives every pod the LAN interface ("macvlan.pods"
	// "all"), so every pod of it that is not on the host network has one.
	All bool
	// Held reads the node's own state: the LAN addresses each attachment
	// holds in the LAN pool's store, keyed by the pod's address on the
	// network (its eth0, from the node's IPAM store). nil: no store to
	// read (a DHCP pool), only the plugin's reports count.
	Held func(ctx context.Context) (map[netip.Addr][]netip.Addr, error)
	Logf func(string, ...any)
}

// Controller answers the plugin's LAN questions on the agent socket
// (pkg/agentsock's Handler) from the informers, and writes the pods' LAN
// addresses and Events through the API.
type Controller struct {
	cs      kubernetes.Interface // nil: no API access (apiErr says why)
	apiErr  error
	node    string
	network string
	logf    func(string, ...any)
	rec     record.EventRecorder

	pods, nss cache.SharedIndexInformer

	ifName string
	all    bool
	held   func(ctx context.Context) (map[netip.Addr][]netip.Addr, error)

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every pod event
	events  map[string]time.Time
	// lan is what this node's own state says of its pods' LAN addresses,
	// by namespace/name: the plugin's reports (root on the agent socket)
	// and the LAN pool's store (refresh). Never the lan-address
	// annotation, which users may edit: that is output only.
	lan map[string]lanEntry
	// lanChanged has a token when lan changed since the last receive
	// (LANChanged: the NetworkPolicy controller compiles again).
	lanChanged chan struct{}
}

// lanEntry is one pod's LAN addresses as the node's own state has them.
type lanEntry struct {
	uid   string // "" when the report carried none
	addrs string // "net1=192.168.50.210/24,..."
	// report: from the plugin's report, not yet seen in the store (a pod
	// whose address on the network kubelet has not posted yet, or a DHCP
	// pool); a store read that does not back it keeps it.
	report bool
}

// New makes the controller and adds its handlers to the informers.
func New(cfg Config) (*Controller, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	l := &Controller{cs: cfg.Client, apiErr: cfg.APIErr, node: cfg.Node, network: cfg.Network, logf: cfg.Logf, rec: cfg.Events,
		pods: cfg.Pods, nss: cfg.Namespaces, changed: make(chan struct{}), events: map[string]time.Time{},
		ifName: cfg.IfName, all: cfg.All, held: cfg.Held, lan: map[string]lanEntry{}, lanChanged: make(chan struct{}, 1)}
	if l.cs == nil || l.pods == nil || l.nss == nil {
		l.pods, l.nss = nil, nil
		return l, nil
	}
	note := func(any) { l.note() }
	for _, inf := range []cache.SharedIndexInformer{l.pods, l.nss} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }, DeleteFunc: note}); err != nil {
			return nil, fmt.Errorf("LAN pods of network %q: %w", cfg.Network, err)
		}
	}
	return l, nil
}

func (l *Controller) note() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

func (l *Controller) changes() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// LANPod says what the pod's annotations ask of the LAN, refusing (with an
// Event on the Pod) a pod of a namespace that may not ask.
func (l *Controller) LANPod(ctx context.Context, network string, ref agentsock.Pod) (agentsock.LAN, error) {
	if l.cs == nil {
		return agentsock.LAN{}, fmt.Errorf("the agent on node %s has no Kubernetes API access (%v), so it cannot read pod %s's annotations", l.node, l.apiErr, ref)
	}
	if l.pods == nil {
		return agentsock.LAN{}, fmt.Errorf("the agent on node %s serves network %q with \"macvlan.pods\" not %q; restart it after changing the config", l.node, network, netconf.PodsAnnotated)
	}
	pod, err := l.pod(ctx, ref)
	if err != nil {
		return agentsock.LAN{}, err
	}
	ann := pod.Annotations
	want := false
	if v := ann[kubenames.AnnotationLAN]; v != "" {
		if want, err = strconv.ParseBool(v); err != nil {
			msg := fmt.Sprintf("annotation %s=%q: want \"true\" or \"false\"", kubenames.AnnotationLAN, v)
			l.event(pod, kubenames.ReasonLANInvalid, msg)
			return agentsock.LAN{}, errors.New(msg)
		}
	}
	var ips []string
	if v := ann[kubenames.AnnotationLANIP]; v != "" {
		addrs, err := netconf.ParseLANAddrs(v)
		if err != nil {
			msg := fmt.Sprintf("annotation %s: %v", kubenames.AnnotationLANIP, err)
			l.event(pod, kubenames.ReasonLANInvalid, msg)
			return agentsock.LAN{}, errors.New(msg)
		}
		for _, a := range addrs {
			ips = append(ips, a.String())
		}
		want = true
	}
	if !want {
		return agentsock.LAN{}, nil
	}
	if ok, err := l.allowed(ctx, pod.Namespace); err != nil {
		return agentsock.LAN{}, err
	} else if !ok {
		msg := fmt.Sprintf("pod %s/%s asks for the LAN (network %q) but namespace %q may not: label it %s=%s to allow its pods", pod.Namespace, pod.Name, network, pod.Namespace, kubenames.LabelLAN, kubenames.LabelLANAllowed)
		l.event(pod, kubenames.ReasonLANForbidden, msg)
		return agentsock.LAN{}, errors.New(msg)
	}
	return agentsock.LAN{Want: true, IPs: ips}, nil
}

// pod finds the pod in the informer's store; on a miss (or another pod of
// the same name) it reads the API once, then waits for the informer up to
// lanWait.
func (l *Controller) pod(ctx context.Context, ref agentsock.Pod) (*corev1.Pod, error) {
	match := func(p *corev1.Pod) bool { return ref.UID == "" || string(p.UID) == ref.UID }
	deadline := time.NewTimer(lanWait)
	defer deadline.Stop()
	asked := false
	for {
		ch := l.changes()
		if obj, ok, _ := l.pods.GetStore().GetByKey(ref.Namespace + "/" + ref.Name); ok {
			if p := obj.(*corev1.Pod); match(p) {
				return p, nil
			}
		}
		if !asked {
			asked = true
			p, err := l.cs.CoreV1().Pods(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			switch {
			case err == nil && match(p):
				return p, nil
			case err != nil && !apierrors.IsNotFound(err):
				l.logf("LAN pods: reading pod %s: %v", ref, err)
			}
		}
		select {
		case <-ch:
		case <-deadline.C:
			return nil, fmt.Errorf("pod %s (uid %q) is not known to the agent on node %s after %s: %w", ref, ref.UID, l.node, lanWait, agentsock.ErrRetry)
		case <-ctx.Done():
			return nil, fmt.Errorf("pod %s: %w (%w)", ref, ctx.Err(), agentsock.ErrRetry)
		}
	}
}

// allowed reports whether namespace ns carries the LAN label.
func (l *Controller) allowed(ctx context.Context, ns string) (bool, error) {
	if obj, ok, _ := l.nss.GetStore().GetByKey(ns); ok {
		if obj.(*corev1.Namespace).Labels[kubenames.LabelLAN] == kubenames.LabelLANAllowed {
			return true, nil
		}
	}
	// A miss or a label not seen yet: the API has the last word.
	n, err := l.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading namespace %q: %v: %w", ns, err, agentsock.ErrRetry)
	}
	return n.Labels[kubenames.LabelLAN] == kubenames.LabelLANAllowed, nil
}

// LANReport writes what the ADD did: the lan-address annotation, or an
// Event saying why the pod got no LAN address. The answer does not wait
// for the API.
func (l *Controller) LANReport(_ context.Context, _ string, ref agentsock.Pod, r agentsock.Report) error {
	if l.cs == nil {
		return fmt.Errorf("no Kubernetes API access: %v", l.apiErr)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: ktypes.UID(ref.UID)}}
	if pod.UID == "" && l.pods != nil {
		// kubectl describe shows the Events of the pod's UID: take it from
		// the informer when the runtime sent no K8S_POD_UID.
		if obj, ok, _ := l.pods.GetStore().GetByKey(ref.Namespace + "/" + ref.Name); ok {
			pod.UID = obj.(*corev1.Pod).UID
		}
	}
	if r.Failure != "" {
		reason := map[string]string{agentsock.FailOutsidePool: kubenames.ReasonLANOutsidePool, agentsock.FailTaken: kubenames.ReasonLANTaken,
			agentsock.FailExhausted: kubenames.ReasonLANExhausted}[r.Failure]
		if reason == "" {
			reason = kubenames.ReasonLANFailed
		}
		l.event(pod, reason, r.Message)
		return nil
	}
	value := r.IfName + "=" + strings.Join(r.Addresses, ",")
	l.mu.Lock()
	key, e := ref.Namespace+"/"+ref.Name, lanEntry{uid: string(pod.UID), addrs: value, report: true}
	if old, ok := l.lan[key]; !ok || old.uid != e.uid || old.addrs != e.addrs {
		l.lan[key] = e
		l.noteLAN()
	}
	l.mu.Unlock()
	go l.annotate(ref, value)
	return nil
}

func (l *Controller) annotate(ref agentsock.Pod, value string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kubenames.AnnotationLANAddress: value}}})
	if _, err := l.cs.CoreV1().Pods(ref.Namespace).Patch(ctx, ref.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: kubenames.Agent}); err != nil {
		l.logf("LAN pods: annotating pod %s %s=%s: %v", ref, kubenames.AnnotationLANAddress, value, err)
		return
	}
	l.logf("LAN pods: pod %s %s=%s", ref, kubenames.AnnotationLANAddress, value)
}

// event records a Warning Event on the pod (the recorder writes it in the
// background), at most once per eventEvery for the same reason and message.
func (l *Controller) event(pod *corev1.Pod, reason, msg string) {
	key := string(pod.UID) + "\x00" + pod.Namespace + "/" + pod.Name + "\x00" + reason + "\x00" + msg
	l.mu.Lock()
	if t, ok := l.events[key]; ok && time.Since(t) < eventEvery {
		l.mu.Unlock()
		return
	}
	l.events[key] = time.Now()
	for k, t := range l.events {
		if time.Since(t) > eventEvery {
			delete(l.events, k)
		}
	}
	l.mu.Unlock()
	l.rec.Event(pod, corev1.EventTypeWarning, reason, msg) // written in the background
	l.logf("LAN pods: pod %s/%s: %s: %s", pod.Namespace, pod.Name, reason, msg)
}

// LANList lists this node's pods with a LAN address, from the node's own
// state (Refresh), never from their lan-address annotations.
func (l *Controller) LANList(ctx context.Context) ([]agentsock.LANPod, error) {
	if l.pods == nil {
		return nil, nil
	}
	if err := l.Refresh(ctx); err != nil {
		l.logf("LAN pods: %v (listing what the plugin reported)", err)
	}
	var out []agentsock.LANPod
	for _, p := range l.localPods() {
		if e, ok := l.entry(p); ok {
			out = append(out, agentsock.LANPod{Namespace: p.Namespace, Name: p.Name, Addresses: e.addrs})
		}
	}
	slices.SortFunc(out, func(a, b agentsock.LANPod) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// localPods are this node's pods in the informer that may hold addresses.
func (l *Controller) localPods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, obj := range l.pods.GetStore().List() {
		p := obj.(*corev1.Pod)
		if p.Spec.NodeName != l.node || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // a cluster-wide informer (NetworkPolicy's too)
		}
		out = append(out, p)
	}
	return out
}

// entry is pod p's LAN addresses as the node's own state has them.
func (l *Controller) entry(p *corev1.Pod) (lanEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.lan[p.Namespace+"/"+p.Name]
	return e, ok && (e.uid == "" || e.uid == string(p.UID))
}

// HasLAN reports whether pod p (of this node) has a LAN interface, as the
// node's own state says: every pod off the host network with "macvlan.pods"
// "all", else what the plugin reported and the LAN pool's store holds. The
// NetworkPolicy controller's LAN warning asks it; its lan-address
// annotation, which users may edit, counts for nothing.
func (l *Controller) HasLAN(p *corev1.Pod) bool {
	if l.all {
		return !p.Spec.HostNetwork
	}
	_, ok := l.entry(p)
	return ok
}

// Refresh rebuilds the pods' LAN addresses from the LAN pool's store (the
// plugin's reports stand for pods the store has nothing about yet, and for
// every pod of a DHCP pool): a pod holds the LAN addresses its sandbox
// (the owner of its address on the network) holds in the store. Entries
// of pods no longer on the node, or recreated under the same name, and
// those the store backed once but no longer does, are dropped. The agent calls it once its informers have synced (a restarted
// agent has no reports), and `villaged status` on each listing.
func (l *Controller) Refresh(ctx context.Context) error {
	if l.pods == nil {
		return nil
	}
	var held map[netip.Addr][]netip.Addr // nil: no store (DHCP), the reports alone
	if l.held != nil {
		var err error
		if held, err = l.held(ctx); err != nil {
			return fmt.Errorf("reading the LAN pool of network %q: %w", l.network, err)
		}
	}
	pods := l.localPods()
	l.mu.Lock()
	defer l.mu.Unlock()
	next := map[string]lanEntry{}
	for _, p := range pods {
		key := p.Namespace + "/" + p.Name
		if old, ok := l.lan[key]; ok && old.report && (old.uid == "" || old.uid == string(p.UID)) {
			next[key] = old // a report the store has not caught up with stands
		}
		var addrs []netip.Addr
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				addrs = append(addrs, held[a.Unmap()]...)
			}
		}
		if len(addrs) == 0 {
			continue
		}
		e := lanEntry{uid: string(p.UID), addrs: l.ifName + "=" + joinAddrs(addrs)}
		if old, ok := l.lan[key]; ok && (old.uid == "" || old.uid == e.uid) && sameAddrs(old.addrs, addrs) {
			e.addrs = old.addrs // the report's form keeps the prefix lengths
		}
		next[key] = e
	}
	if !maps.EqualFunc(l.lan, next, func(a, b lanEntry) bool { return a.uid == b.uid && a.addrs == b.addrs }) {
		l.noteLAN()
	}
	l.lan = next
	return nil
}

// noteLAN says that the answers of HasLAN changed (l.mu held).
func (l *Controller) noteLAN() {
	select {
	case l.lanChanged <- struct{}{}:
	default:
	}
}

// LANChanged receives a token after the pods' LAN addresses changed (a
// report, a Refresh that found something else): HasLAN may answer
// differently. One consumer, the NetworkPolicy controller.
func (l *Controller) LANChanged() <-chan struct{} { return l.lanChanged }

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	slices.Sort(s)
	return strings.Join(s, ",")
}

// sameAddrs reports whether a report's value ("net1=a/24,b/64") names
// exactly addrs.
func sameAddrs(value string, addrs []netip.Addr) bool {
	_, list, _ := strings.Cut(value, "=")
	var got []string
	for _, s := range strings.Split(list, ",") {
		if pfx, err := netip.ParsePrefix(s); err == nil {
			got = append(got, pfx.Addr().Unmap().String())
		} else if a, err := netip.ParseAddr(s); err == nil {
			got = append(got, a.Unmap().String())
		}
	}
	slices.Sort(got)
	return strings.Join(got, ",") == joinAddrs(addrs)
}
