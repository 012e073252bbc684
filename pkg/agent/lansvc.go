package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/ipam/store/etcd"
	"github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/lansvc"
	"github.com/village-cni/village/pkg/macvlan"
)

// Services on the LAN ("macvlan.services"): with the key on, `villaged
// run` runs pkg/lansvc over the agent's Kubernetes side (its client,
// shared informers and Event recorder), on the network's LAN interface,
// allocating in the LAN pool's own store.

// lanServicesFeature runs pkg/lansvc in wg when the network has it on.
// The LAN interface's address and the LAN pool's store may not be there
// yet (a DHCP address, the host credentials of a kubernetes store): they
// are retried until ctx is done.
type lanServicesFeature struct{}

func (lanServicesFeature) Name() string { return "LAN Services" }

func (lanServicesFeature) Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error {
	c, logf := a.c, a.opts.logf
	lan := c.Net.LAN
	if lan == nil || lan.Services == nil {
		return nil
	}
	side, err := a.n.kubeSide()
	if err != nil {
		logf("LAN Services: no Kubernetes API client (%v): OFF", err)
		return nil
	}
	wg.Go(func() {
		cfg := lansvc.Config{Node: c.Node, Network: c.Net.Name, RunDir: a.opts.RunDir, Services: lan.Services,
			Kube: lansvc.Kube{Client: side.cs, Services: side.services(), EndpointSlices: side.endpointSlices(),
				Nodes: side.nodes(), Namespaces: side.namespaces(), Events: side.rec},
			Log: slog.New(newLogfHandler(logf, "LAN Services")), Logf: logf, Retry: retryEvery}
		if retry(ctx, a.opts, "LAN Services: finding the LAN interface, its address and the LAN pool's store", func() error {
			master, err := macvlan.ResolveMaster(lan.Master)
			if err != nil {
				return err
			}
			cfg.Interface = master.Attrs().Name
			if cfg.Addr, cfg.Own, err = lansvc.LANAddress(cfg.Interface, lan.Sets); err != nil {
				return err
			}
			cfg.Store, err = a.openLANStore()
			return err
		}) != nil {
			return // stopped while waiting
		}
		lansvc.Run(ctx, cfg)
	})
	return nil
}

// openLANStore opens the LAN pool's store, as its IPAM plugin does.
func (a *agent) openLANStore() (store.Store, error) {
	c := a.c
	if c.LANStoreErr != nil {
		return nil, c.LANStoreErr
	}
	st := c.LANStore
	switch st.Type {
	case ipamconfig.StoreEtcd:
		return etcd.New(etcd.Options{Endpoints: st.Endpoints, CAFile: st.CAFile, CertFile: st.CertFile, KeyFile: st.KeyFile,
			Prefix: st.Prefix, Network: c.Net.Name, NodeName: c.Node})
	case ipamconfig.StoreKubernetes:
		// The store's Leases are written as the host-side village-ipam
		// identity (hostcreds.go), whose grants and admission policy are
		// exactly the Leases of the pool.
		return kube.New(kube.Options{Kubeconfig: st.Kubeconfig, Namespace: st.Namespace, Network: c.Net.Name, NodeName: c.Node})
	default:
		var d struct {
			DataDir string `json:"dataDir"`
		}
		_ = json.Unmarshal(c.Net.LAN.IPAM, &d) // validated by netconf
		return disk.New(disk.Options{DataDir: d.DataDir, Network: c.Net.Name})
	}
}

// Status is what this node answers for, from the status file lansvc.Run
// writes; nil when the feature is off.
func (lanServicesFeature) Status(_ context.Context, v *view) ([]string, bool) {
	c := v.c
	if c.Net.LAN == nil || c.Net.LAN.Services == nil {
		return nil, true
	}
	return lansvc.StatusLines(c.Net.LAN.Services, v.runDir, c.Net.Name), true
}
