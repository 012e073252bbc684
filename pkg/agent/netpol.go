package agent

import (
	"context"
	"fmt"
	"sync"

	"github.com/village-cni/village/pkg/metrics"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/drops"
	"github.com/village-cni/village/pkg/netpol/table"
)

// NetworkPolicy enforcement is the village entry's key "networkPolicy"
// (default false, netconf.NetConf.NetworkPolicy, parsed with the rest of
// the entry). On, `villaged run` runs pkg/netpol/controller over the
// agent's Kubernetes side (kube.go: the kubernetes registry's kubeconfig,
// else the in-cluster configuration; the shared informers); off, it
// removes whatever an earlier run with it on installed, so nothing of it
// is left.

// policyFeature runs the controller in wg when the key is on, and removes
// its tables and files when it is off.
type policyFeature struct{}

func (policyFeature) Name() string { return "network policy" }

func (policyFeature) Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error {
	if !a.c.Net.NetworkPolicy {
		if err := controller.Disable(a.opts.RunDir, a.c.Net.Name); err != nil {
			a.opts.logf("network policy is off; removing its tables: %v", err)
		}
		return nil
	}
	side, err := a.n.kubeSide()
	if err != nil {
		a.opts.logf("network policy: no Kubernetes API client: %v: NOT ENFORCED", err)
		return nil
	}
	// The informers are the Kubernetes side's (the Pod informer lists the
	// whole cluster's pods when the key is on); Run starts them.
	cfg := controller.Config{Network: a.c.Net.Name, Bridge: a.c.Net.Bridge, Node: a.c.Node, Pods: side.pods(), Namespaces: side.namespaces(),
		Policies: side.policies(), Events: side.rec, RunDir: a.opts.RunDir, Metrics: a.m, Logf: a.opts.logf,
		Repair: a.opts.safetyNet(), Retry: a.opts.Period}
	if a.nft != nil {
		cfg.Kick, cfg.Marks = a.nft.policy, a.nft.marks
	}
	if a.lan != nil {
		cfg.LAN, cfg.LANChanged = a.lan.HasLAN, a.lan.LANChanged()
	}
	rec := a.startDrops(ctx, wg)
	cfg.Model = rec.SetModel
	wg.Go(func() {
		err := controller.Run(ctx, cfg)
		if err != nil && ctx.Err() == nil {
			a.opts.logf("network policy controller stopped: %v", err)
		}
	})
	a.opts.logf("network policy: enforcing NetworkPolicy of network %q in nftables table inet %s", a.c.Net.Name, table.PolicyTable(a.c.Net.Name))
	return nil
}

// Status is the policy tables against the last compile.
func (policyFeature) Status(_ context.Context, v *view) ([]string, bool) {
	return policyStatus(v.c, v.runDir)
}

// startDrops names what the policy tables drop (pkg/netpol/drops: the
// NFLOG samples, the drops file) in wg, and makes the chains' counters
// village_policy_drops_total; the controller gives the returned recorder
// its models.
func (a *agent) startDrops(ctx context.Context, wg *sync.WaitGroup) *drops.Recorder {
	network := a.c.Net.Name
	rec := drops.NewRecorder(network, 0)
	totals := drops.NewTotals()
	a.m.PolicyDrops(network, func() ([]metrics.PolicyDrop, error) {
		cds, err := table.Drops(network)
		if err != nil {
			return nil, err
		}
		var out []metrics.PolicyDrop
		for l, n := range totals.Observe(cds, rec.Names()) {
			out = append(out, metrics.PolicyDrop{Direction: l.Direction, Namespace: l.Namespace, Policy: l.Policy, Packets: n})
		}
		return out, nil
	})
	wg.Go(func() {
		err := drops.Run(ctx, drops.Config{Network: network, RunDir: a.opts.RunDir, Recorder: rec, Logf: a.opts.logf,
			Sampled: func(dir string) { a.m.PolicyDropSampled(network, dir) }})
		if err != nil && ctx.Err() == nil {
			a.opts.logf("policy drops: no samples (%v); the drop counts stay exact", err)
		}
	})
	return rec
}

// policyStatus are `villaged status` lines about the network's policy
// tables; ok is false when the kernel does not hold what the controller
// last compiled. c is the config status parsed once.
func policyStatus(c *Conf, runDir string) (lines []string, ok bool) {
	on := c.Net.NetworkPolicy
	have, present, err := table.Observe(c.Net.Name)
	if err != nil {
		return []string{"network policy: " + err.Error()}, false
	}
	if !on {
		if present {
			return []string{fmt.Sprintf("network policy: off, but table inet %s is present", table.PolicyTable(c.Net.Name))}, false
		}
		return []string{"network policy: off"}, true
	}
	st, err := controller.ReadStatus(runDir, c.Net.Name)
	if err != nil || st == nil {
		return []string{fmt.Sprintf("network policy: on, no compile yet (%v)", err)}, false
	}
	kernel := "kernel matches"
	ok = present && st.Error == ""
	switch {
	case !present:
		kernel = "kernel: table inet " + table.PolicyTable(c.Net.Name) + " MISSING"
	case table.Diff(st.Want, have) != "":
		kernel, ok = "kernel DRIFTED: "+table.Diff(st.Want, have), false
	}
	lines = append(lines, fmt.Sprintf("network policy: %d policies, %d local pods compiled, %d isolated; %s (compiled %s)",
		st.Policies, st.Compiled, st.Pods, kernel, st.Time.Format("15:04:05")))
	if st.Error != "" {
		lines = append(lines, "network policy: last apply failed: "+st.Error)
	}
	for _, p := range st.Problems {
		lines = append(lines, "network policy: not enforced: "+p)
	}
	return lines, ok
}
