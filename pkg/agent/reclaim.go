package agent

import (
	"context"
	"slices"
	"time"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store/etcd"
	"github.com/village-cni/village/pkg/registry"
)

// reclaimer releases what nodes gone from the registry for longer than the
// grace period hold: their subnet leases, and their allocations in the
// network's LAN pool when that pool is in the registry's etcd. Every agent
// runs it every period; registry.Reclaim makes sure one of them does it,
// once, and never while the node has a record.
type reclaimer struct {
	reg   *registry.Registry
	grace time.Duration
	lan   *ipamconfig.StoreConfig // the LAN pool's store, nil: none to reclaim
	net   string
	logf  func(string, ...any)
}

// newReclaimer returns nil when reclaiming is off (reclaimAfter -1).
func newReclaimer(c *Conf, reg *registry.Registry, logf func(string, ...any)) *reclaimer {
	r := c.Registry()
	if r.ReclaimAfter < 0 {
		return nil
	}
	rc := &reclaimer{reg: reg, grace: time.Duration(r.ReclaimAfter) * time.Second, net: c.Net.Name, logf: logf}
	switch st := c.LANStore; {
	case c.LANStoreErr != nil:
		logf("network %q: %v: departed nodes' LAN allocations are not reclaimed", c.Net.Name, c.LANStoreErr)
	case st == nil || st.Type != ipamconfig.StoreEtcd:
	case !slices.Equal(slices.Sorted(slices.Values(st.Endpoints)), slices.Sorted(slices.Values(r.Endpoints))):
		logf("the LAN pool of network %q is in another etcd than the registry: departed nodes' LAN allocations are not reclaimed", c.Net.Name)
	default:
		rc.lan = st
	}
	return rc
}

// pass marks departures and reclaims those past the grace period.
func (rc *reclaimer) pass(ctx context.Context) {
	var byNode map[string][]etcd.NodeAllocation
	held := map[string][]registry.Held{} // by node: its LAN allocations as read
	if rc.lan != nil {
		var err error
		if byNode, err = etcd.AllocationsByNode(ctx, rc.reg.Client(), rc.lan.Prefix, rc.net); err != nil {
			rc.logf("reclaim: reading the LAN pool: %v", err)
			return
		}
		for n, as := range byNode {
			for _, a := range as {
				held[n] = append(held[n], registry.Held{Key: a.Key, Rev: a.Rev, Delete: a.Keys})
			}
		}
	}
	now := time.Now()
	deps, err := rc.reg.Departures(ctx, held, now)
	if err != nil {
		rc.logf("reclaim: %v", err)
		return
	}
	for _, d := range deps {
		var ips []string
		for _, a := range byNode[d.Node] {
			ips = append(ips, a.IP.String())
		}
		subnets, won, err := rc.reg.Reclaim(ctx, d, rc.grace, now, held[d.Node])
		switch {
		case err != nil:
			rc.logf("reclaim: node %s: %v", d.Node, err)
		case won:
			rc.logf("reclaimed from node %s, gone since %s (longer than %s): subnets %v, LAN addresses %v",
				d.Node, d.Since.Format(time.RFC3339), rc.grace, subnets, ips)
		}
	}
}
