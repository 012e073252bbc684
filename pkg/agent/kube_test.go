package agent

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/pkg/netconf"
)

// TestKubeSideStartsOnce: against a real kube-apiserver, the Kubernetes
// side takes exactly the informers each config turns on, its one start
// starts them all and syncs them, and a second start starts nothing (an
// informer a feature took behind take's back would stay unstarted, which
// the e2e tests of each feature would see).
func TestKubeSideStartsOnce(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	var (
		node   = reflect.TypeOf(&corev1.Node{})
		pod    = reflect.TypeOf(&corev1.Pod{})
		ns     = reflect.TypeOf(&corev1.Namespace{})
		svc    = reflect.TypeOf(&corev1.Service{})
		es     = reflect.TypeOf(&discoveryv1.EndpointSlice{})
		policy = reflect.TypeOf(&networkingv1.NetworkPolicy{})
	)
	kubeRegistry := &netconf.Backend{Registry: &netconf.Registry{Type: netconf.RegistryKubernetes}}
	etcdRegistry := &netconf.Backend{Registry: &netconf.Registry{Type: netconf.RegistryEtcd}}
	for _, tc := range []struct {
		name    string
		net     netconf.NetConf
		backend *netconf.Backend
		metrics bool
		want    []reflect.Type
	}{
		{name: "kubernetes registry", backend: kubeRegistry, want: []reflect.Type{node}},
		{name: "kubernetes registry and metrics", backend: kubeRegistry, metrics: true, want: []reflect.Type{node, pod}},
		{name: "NetworkPolicy", backend: etcdRegistry, net: netconf.NetConf{NetworkPolicy: true}, want: []reflect.Type{pod, ns, policy}},
		{name: "LAN pods, all", backend: etcdRegistry, net: netconf.NetConf{LAN: &netconf.LAN{Pods: netconf.PodsAll}}},
		{name: "LAN pods, annotated", backend: etcdRegistry, net: netconf.NetConf{LAN: &netconf.LAN{Pods: netconf.PodsAnnotated}}, want: []reflect.Type{pod, ns}},
		{name: "LAN Services", backend: etcdRegistry, net: netconf.NetConf{LAN: &netconf.LAN{Pods: netconf.PodsAll, Services: &netconf.Services{}}},
			want: []reflect.Type{node, ns, svc, es}},
		{name: "everything", backend: kubeRegistry, metrics: true, net: netconf.NetConf{NetworkPolicy: true, LAN: &netconf.LAN{Pods: netconf.PodsAnnotated, Services: &netconf.Services{}}},
			want: []reflect.Type{node, pod, ns, policy, svc, es}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := &Conf{Net: &tc.net, Backend: tc.backend}
			side := newKubeSide(&kubeAPI{cs: kube.Client, conf: newConfinement()}, "n1", tc.net.NetworkPolicy)
			defer side.shutdown()
			defer cancel() // the informers stop before shutdown waits for them
			side.take(c, tc.metrics)
			side.start(ctx.Done())
			synced := side.factory.WaitForCacheSync(ctx.Done())
			var got []reflect.Type
			for typ, ok := range synced {
				if !ok {
					t.Errorf("%v did not sync", typ)
				}
				got = append(got, typ)
			}
			name := func(a, b reflect.Type) int { return strings.Compare(a.String(), b.String()) }
			slices.SortFunc(got, name)
			want := slices.SortedFunc(slices.Values(tc.want), name)
			if !slices.Equal(got, want) {
				t.Errorf("started %v, want %v", got, want)
			}
			// An informer taken after the one start is not started by a
			// second one.
			side.services()
			side.start(ctx.Done())
			if n := len(side.factory.WaitForCacheSync(ctx.Done())); n != len(want) {
				t.Errorf("a second start started %d informers, want %d", n, len(want))
			}
		})
	}
}
