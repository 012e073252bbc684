package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/ipam/store/etcd"
	"github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// lanHeld is what pkg/lanpods reports and decides about LAN pods from (its
// Config.Held): the node's own state, never the pods' lan-address
// annotations, which users may edit. It joins two stores: the network's
// IPAM store on this node (an address on the network -> the sandbox that
// holds it, the owner the runtime gave) and the LAN pool's store (that
// sandbox's LAN interface -> its LAN addresses). It returns nil when the
// LAN pool has no store to read (DHCP: the plugin's reports count alone).
func (c *Conf) lanHeld(runDir string) func(context.Context) (map[netip.Addr][]netip.Addr, error) {
	lan := c.Net.LAN
	if lan == nil || lan.IPAMType == netconf.LANDHCP || c.LANStore == nil {
		return nil
	}
	return func(ctx context.Context) (map[netip.Addr][]netip.Addr, error) {
		held, err := disk.Peek(c.DataDir, c.Net.Name, true)
		if err != nil {
			return nil, err
		}
		bySandbox := map[string][]netip.Addr{}
		for _, r := range held {
			if !r.Corrupt && r.Owner.IfName != lan.IfName {
				bySandbox[r.Owner.ContainerID] = append(bySandbox[r.Owner.ContainerID], r.IP)
			}
		}
		allocs, err := c.lanAllocations(ctx, runDir)
		if err != nil {
			return nil, err
		}
		out := map[netip.Addr][]netip.Addr{}
		for _, a := range allocs {
			if a.Owner.IfName != lan.IfName {
				continue
			}
			for _, ip := range bySandbox[a.Owner.ContainerID] {
				out[ip] = append(out[ip], a.IP)
			}
		}
		return out, nil
	}
}

// lanAllocations lists the LAN pool's allocations through its store, as
// the LAN IPAM plugin reaches it (the kubernetes store through the host
// credentials the agent writes, hostcreds.go).
func (c *Conf) lanAllocations(ctx context.Context, runDir string) ([]store.Allocation, error) {
	st := c.LANStore
	var s store.Store
	var err error
	switch st.Type {
	case ipamconfig.StoreKubernetes:
		path := st.Kubeconfig
		if path == "" {
			path = nodelocal.HostKubeconfig(runDir)
		}
		s, err = kube.New(kube.Options{Kubeconfig: path, Namespace: st.Namespace, Network: c.Net.Name, NodeName: c.Node})
	case ipamconfig.StoreEtcd:
		s, err = etcd.New(etcd.Options{Endpoints: st.Endpoints, CAFile: st.CAFile, CertFile: st.CertFile, KeyFile: st.KeyFile,
			Prefix: st.Prefix, Network: c.Net.Name, NodeName: c.Node})
	default:
		var k struct {
			DataDir string `json:"dataDir"`
		}
		_ = json.Unmarshal(c.Net.LAN.IPAM, &k) // parsed whole by Load already
		rs, perr := disk.Peek(k.DataDir, c.Net.Name, true)
		var out []store.Allocation
		for _, r := range rs {
			if !r.Corrupt {
				out = append(out, store.Allocation{IP: r.IP, Owner: r.Owner})
			}
		}
		return out, perr
	}
	if err != nil {
		return nil, fmt.Errorf("the LAN pool's %s store: %w", st.Type, err)
	}
	defer s.Close()
	return s.List(ctx)
}
