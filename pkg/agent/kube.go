package agent

import (
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	kuberecord "k8s.io/client-go/tools/record"

	"github.com/village-cni/village/pkg/kubeconfig"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/kuberegistry"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netpol/controller"
)

// kubeAPI is the agent's one client of the Kubernetes API: the registry's
// kubeconfig when the registry is kubernetes, else the in-cluster
// configuration. A process makes it once (node.api) and every user shares
// it: the kubernetes registry, the informers, the LAN pods' direct reads
// and patches, the Events, the host credentials' TokenRequests.
type kubeAPI struct {
	rc *rest.Config // the LAN pods' host credentials name its server and CA
	cs kubernetes.Interface
	// conf is the agent's confinement (confine.go): every write through
	// cs waits for it to be proved (writeGate).
	conf *confinement
}

// newKubeAPI builds the client (no request is made).
func (c *Conf) newKubeAPI() (*kubeAPI, error) {
	path := ""
	if r := c.Registry(); r != nil && r.Type == netconf.RegistryKubernetes {
		path = r.Kubeconfig
	}
	rc, err := kubeconfig.REST(path)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = kubenames.Agent
	conf := newConfinement()
	gated := rest.CopyConfig(rc)
	gated.Wrap(func(rt http.RoundTripper) http.RoundTripper { return writeGate{next: rt, conf: conf} })
	cs, err := kubernetes.NewForConfig(gated)
	if err != nil {
		return nil, fmt.Errorf("kubernetes API %s: %w", rc.Host, err)
	}
	return &kubeAPI{rc: rc, cs: cs, conf: conf}, nil
}

// kubeSide is the agent's Kubernetes side in `villaged run`, made once
// (kube-router's pattern): the one client, one shared informer factory
// and one Event recorder. Every kind is watched once, whoever reads it:
// Nodes (the kubernetes registry, LAN Services), Pods and Namespaces (the
// LAN pods and the NetworkPolicy controllers), NetworkPolicies, Services
// and EndpointSlices (LAN Services). Each controller is handed only what
// it uses (its informers, the clientset, the recorder), never the
// factory.
//
// Which informers there are is decided once, from the config (take, when
// the side is made), and the factory is started once (start, by Run
// before the first feature reads them): a feature asks the side for an
// informer the config turned on, and finds it running or about to; the
// controllers add their handlers to running informers.
type kubeSide struct {
	*kubeAPI
	node    string
	factory informers.SharedInformerFactory
	events  kuberecord.EventBroadcaster
	rec     kuberecord.EventRecorder
	// allPods says the Pod informer lists every pod of the cluster
	// (NetworkPolicy needs them; the LAN pods controller then reads its
	// node's from the same cache); false: only this node's pods (a field
	// selector on spec.nodeName), all the LAN pods controller needs.
	allPods bool
	started bool
}

// kubeSide is this process's Kubernetes side, made on first use (by the
// kubernetes registry, the LAN pods, NetworkPolicy), or the error that
// says why there is none. Nothing watches until start.
func (n *node) kubeSide() (*kubeSide, error) {
	if n.side == nil && n.sideErr == nil {
		api, err := n.c.newKubeAPI()
		if err != nil {
			n.sideErr = err
		} else {
			n.side = newKubeSide(api, n.c.Node, n.c.Net.NetworkPolicy)
			n.side.take(n.c, n.metrics)
		}
	}
	return n.side, n.sideErr
}

// newKubeSide makes the factory and the recorder over api; allPods as in
// kubeSide.
func newKubeSide(api *kubeAPI, node string, allPods bool) *kubeSide {
	k := &kubeSide{kubeAPI: api, node: node, allPods: allPods}
	k.factory = informers.NewSharedInformerFactoryWithOptions(api.cs, 0, informers.WithTransform(slim))
	k.events = kuberecord.NewBroadcaster()
	k.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: api.cs.CoreV1().Events("")})
	k.rec = k.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: kubenames.Agent, Host: node})
	return k
}

// slim is the factory's transform: each kind keeps only what its readers
// read, so the caches of a large cluster stay small.
func slim(obj any) (any, error) {
	switch obj.(type) {
	case *corev1.Node:
		return slimNode(obj.(*corev1.Node))
	case *corev1.Pod:
		return controller.SlimPod(obj) // keeps Village's annotations too (LAN pods)
	}
	return obj, nil
}

// slimNode is the registry's slim Node (its name, pod subnets and
// Village's annotations) with what the LAN Services controller reads too:
// the Ready condition (its status alone) and the label excluding it from
// external load balancers.
func slimNode(n *corev1.Node) (any, error) {
	obj, err := kuberegistry.Slim(n)
	s, ok := obj.(*corev1.Node)
	if err != nil || !ok {
		return obj, err
	}
	if v, excluded := n.Labels[kubenames.LabelExcludeFromLB]; excluded {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[kubenames.LabelExcludeFromLB] = v
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			s.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return s, nil
}

// pods is the one Pod informer (see allPods).
func (k *kubeSide) pods() cache.SharedIndexInformer {
	return k.factory.InformerFor(&corev1.Pod{}, func(cs kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		var scope func(*metav1.ListOptions)
		if !k.allPods {
			scope = func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.node).String()
			}
		}
		return coreinformers.NewFilteredPodInformer(cs, metav1.NamespaceAll, resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}, scope)
	})
}

func (k *kubeSide) namespaces() cache.SharedIndexInformer {
	return k.factory.Core().V1().Namespaces().Informer()
}

func (k *kubeSide) nodes() cache.SharedIndexInformer { return k.factory.Core().V1().Nodes().Informer() }

// services and endpointSlices are taken only with "macvlan.services" on.
func (k *kubeSide) services() cache.SharedIndexInformer {
	return k.factory.Core().V1().Services().Informer()
}

func (k *kubeSide) endpointSlices() cache.SharedIndexInformer {
	return k.factory.Discovery().V1().EndpointSlices().Informer()
}

func (k *kubeSide) policies() cache.SharedIndexInformer {
	return k.factory.Networking().V1().NetworkPolicies().Informer()
}

// take takes every informer the config turns on, before the factory
// starts: Nodes for the kubernetes registry and LAN Services; Pods for
// annotated LAN pods, NetworkPolicy and the per-pod traffic metrics
// (metrics); Namespaces for those two features and LAN Services;
// NetworkPolicies; Services and EndpointSlices for LAN Services.
func (k *kubeSide) take(c *Conf, metrics bool) {
	lan := c.Net.LAN
	annotated := lan != nil && lan.Pods == netconf.PodsAnnotated
	services := lan != nil && lan.Services != nil
	if r := c.Registry(); (r != nil && r.Type == netconf.RegistryKubernetes) || services {
		k.nodes()
	}
	if annotated || c.Net.NetworkPolicy || metrics {
		k.pods()
	}
	if annotated || c.Net.NetworkPolicy || services {
		k.namespaces()
	}
	if c.Net.NetworkPolicy {
		k.policies()
	}
	if services {
		k.services()
		k.endpointSlices()
	}
}

// start starts the informers take took, until stop is closed. Run calls
// it once; a second call is a bug (it would start an informer a feature
// took behind take's back), and does nothing.
func (k *kubeSide) start(stop <-chan struct{}) {
	if k.started {
		return
	}
	k.started = true
	k.factory.Start(stop)
}

// shutdown waits for the informers (after stop) and flushes the Events.
func (k *kubeSide) shutdown() {
	k.factory.Shutdown()
	k.events.Shutdown()
}
