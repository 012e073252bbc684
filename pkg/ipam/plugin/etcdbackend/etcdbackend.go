// Package etcdbackend builds the etcd store into the IPAM plugin when
// imported (for its side effect) by the village-ipam-etcd binary.
package etcdbackend

import (
	"context"

	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/plugin"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/etcd"
)

func init() { plugin.Register(config.StoreEtcd, open) }

func open(_ context.Context, c *config.Config) (store.Store, error) {
	return etcd.New(etcd.Options{
		Endpoints: c.Store.Endpoints,
		CAFile:    c.Store.CAFile,
		CertFile:  c.Store.CertFile,
		KeyFile:   c.Store.KeyFile,
		Prefix:    c.Store.Prefix,
		Network:   c.Name,
		NodeName:  c.Store.NodeName,
	})
}
