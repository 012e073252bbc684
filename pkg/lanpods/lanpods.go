package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/subnetfile"
)

// lanWait bounds how long a lookup waits for a pod the agent has not seen
// yet (after one direct read of the API missed it too); then the ADD fails
// with CNI code 11 and kubelet retries the sandbox.
const lanWait = 10 * time.Second

// eventEvery is how often the same Event (pod, reason, message) is written
// again while kubelet keeps retrying the same failed ADD.
const eventEvery = time.Minute

// lanPods answers the plugin on the agent socket (pkg/agentsock) from an
// informer over the Pods bound to this node (field selector spec.nodeName)
// and one over Namespaces, and writes the pods' LAN addresses and Events
// through the API.
type lanPods struct {
	cs      kubernetes.Interface // nil: no API access (apiErr says why)
	apiErr  error
	node    string
	network string
	logf    func(string, ...any)

	pods, nss cache.SharedIndexInformer

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every pod event
	events  map[string]time.Time
}

// startLANPods serves the agent socket when the network has a LAN section,
// and with pods "annotated" watches this node's Pods and the Namespaces.
// It returns once the socket exists; everything stops with ctx (wait
// returns when it has).
func startLANPods(ctx context.Context, c *Conf, opts Options) (wait func(), err error) {
	lan := c.Net.LAN
	if lan == nil {
		return func() {}, nil
	}
	runDir := opts.RunDir
	if runDir == "" {
		runDir = subnetfile.RunDir()
	}
	l := &lanPods{node: c.Node, network: c.Net.Name, logf: opts.logf, changed: make(chan struct{}), events: map[string]time.Time{}}
	rc, cs, err := c.kubeClient()
	if err == nil {
		l.cs = cs
	} else {
		l.apiErr = err
		opts.logf("LAN pods: no Kubernetes API (%v): lookups of annotated pods fail", err)
	}
	path := agentsock.Path(runDir)
	ln, err := agentsock.Listen(path)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	if l.cs != nil && lan.Pods == netconf.PodsAnnotated {
		l.watch(ctx, &wg)
	}
	if l.cs != nil && rc != nil {
		if err := startHostCreds(ctx, &wg, c, rc, l.cs, runDir, opts.logf); err != nil {
			opts.logf("LAN pods: host credentials: %v", err)
		}
	}
	wg.Go(func() { agentsock.Serve(ctx, ln, l, opts.logf) })
	opts.logf("LAN pods (%q): answering on %s", lan.Pods, path)
	return wg.Wait, nil
}

func (l *lanPods) watch(ctx context.Context, wg *sync.WaitGroup) {
	pf := informers.NewSharedInformerFactoryWithOptions(l.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", l.node).String()
	}))
	l.pods = pf.Core().V1().Pods().Informer()
	nf := informers.NewSharedInformerFactory(l.cs, 0)
	l.nss = nf.Core().V1().Namespaces().Informer()
	note := func(any) { l.note() }
	for _, inf := range []cache.SharedIndexInformer{l.pods, l.nss} {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }, DeleteFunc: note})
	}
	pf.Start(ctx.Done())
	nf.Start(ctx.Done())
	wg.Go(func() { <-ctx.Done(); pf.Shutdown(); nf.Shutdown() })
}

func (l *lanPods) note() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

func (l *lanPods) changes() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// LANPod says what the pod's annotations ask of the LAN, refusing (with an
// Event on the Pod) a pod of a namespace that may not ask.
func (l *lanPods) LANPod(ctx context.Context, network string, ref agentsock.Pod) (agentsock.LAN, error) {
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
func (l *lanPods) pod(ctx context.Context, ref agentsock.Pod) (*corev1.Pod, error) {
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
func (l *lanPods) allowed(ctx context.Context, ns string) (bool, error) {
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
func (l *lanPods) LANReport(_ context.Context, _ string, ref agentsock.Pod, r agentsock.Report) error {
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
	go l.annotate(ref, value)
	return nil
}

func (l *lanPods) annotate(ref agentsock.Pod, value string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kubenames.AnnotationLANAddress: value}}})
	if _, err := l.cs.CoreV1().Pods(ref.Namespace).Patch(ctx, ref.Name, ktypes.MergePatchType, patch, metav1.PatchOptions{FieldManager: "villaged"}); err != nil {
		l.logf("LAN pods: annotating pod %s %s=%s: %v", ref, kubenames.AnnotationLANAddress, value, err)
		return
	}
	l.logf("LAN pods: pod %s %s=%s", ref, kubenames.AnnotationLANAddress, value)
}

// event writes a Warning Event on the pod (in the background), at most once
// per eventEvery for the same reason and message.
func (l *lanPods) event(pod *corev1.Pod, reason, msg string) {
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
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
			UID: pod.UID},
		Reason: reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "village", Host: l.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: kubenames.Prefix + "villaged", ReportingInstance: l.node,
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := l.cs.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			l.logf("LAN pods: Event %s on pod %s/%s: %v", reason, pod.Namespace, pod.Name, err)
		}
	}()
	l.logf("LAN pods: pod %s/%s: %s: %s", pod.Namespace, pod.Name, reason, msg)
}

// LANList lists this node's pods with a LAN address (their annotation).
func (l *lanPods) LANList(context.Context) ([]agentsock.LANPod, error) {
	if l.pods == nil {
		return nil, nil
	}
	var out []agentsock.LANPod
	for _, obj := range l.pods.GetStore().List() {
		p := obj.(*corev1.Pod)
		if v := p.Annotations[kubenames.AnnotationLANAddress]; v != "" {
			out = append(out, agentsock.LANPod{Namespace: p.Namespace, Name: p.Name, Addresses: v})
		}
	}
	slices.SortFunc(out, func(a, b agentsock.LANPod) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// inClusterNamespace is the agent's own namespace (kube-system when it
// cannot tell).
func inClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return "kube-system"
	}
	return strings.TrimSpace(string(b))
}

// lanStatus is `villaged status`'s lines about the node's LAN pods, as the
// running agent knows them (asked on its socket); nil without a LAN section.
func lanStatus(ctx context.Context, c *Conf, runDir string) []string {
	if c.Net.LAN == nil {
		return nil
	}
	if runDir == "" {
		runDir = subnetfile.RunDir()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := agentsock.Ask(ctx, agentsock.Path(runDir), agentsock.Request{Op: agentsock.OpLANList})
	if err != nil {
		return []string{fmt.Sprintf("LAN pods (%q): unknown: %v", c.Net.LAN.Pods, err)}
	}
	lines := []string{fmt.Sprintf("LAN pods (%q, %d):", c.Net.LAN.Pods, len(resp.Pods))}
	for _, p := range resp.Pods {
		lines = append(lines, fmt.Sprintf("  %s/%s\t%s", p.Namespace, p.Name, p.Addresses))
	}
	return lines
}
