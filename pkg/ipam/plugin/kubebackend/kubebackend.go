// Package kubebackend builds the kubernetes store into the IPAM plugin when
// imported (for its side effect) by the village-ipam-kube binary.
package kubebackend

import (
	"context"

	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/plugin"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/kube"
)

func init() { plugin.Register(config.StoreKubernetes, open) }

func open(_ context.Context, c *config.Config) (store.Store, error) {
	return kube.New(kube.Options{
		Kubeconfig: c.Store.Kubeconfig,
		Namespace:  c.Store.Namespace,
		Network:    c.Name,
		NodeName:   c.Store.NodeName,
	})
}
