package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/lanpods"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// lanPodsFeature serves the agent socket when the network has a LAN
// section, its LAN questions answered by the pkg/lanpods controller (set
// as a.lan) and its DHCP requests by a.dhcp (nil: the LAN's addresses do
// not come from DHCP), which with pods "annotated" reads the Kubernetes
// side's Pod and Namespace informers (started by Run). It also keeps the
// LAN pool's host credentials (hostcreds.go). Start returns once the
// socket exists.
type lanPodsFeature struct{}

func (lanPodsFeature) Name() string { return "LAN pods" }

func (lanPodsFeature) Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error {
	c, opts, dhcp := a.c, a.opts, a.dhcp
	lan := c.Net.LAN
	if lan == nil {
		return nil
	}
	runDir := opts.RunDir
	if runDir == "" {
		runDir = nodelocal.RunDir()
	}
	cfg := lanpods.Config{Network: c.Net.Name, Node: c.Node, Logf: opts.logf, IfName: lan.IfName,
		All: lan.Pods != netconf.PodsAnnotated, Held: c.lanHeld(runDir)}
	side, err := a.n.kubeSide()
	if err == nil {
		cfg.Client, cfg.Events = side.cs, side.rec
		if lan.Pods == netconf.PodsAnnotated {
			cfg.Pods, cfg.Namespaces = side.pods(), side.namespaces()
		}
	} else {
		cfg.APIErr = err
		opts.logf("LAN pods: no Kubernetes API (%v): lookups of annotated pods fail", err)
	}
	ctl, err := lanpods.New(cfg)
	if err != nil {
		return err
	}
	path := c.agentSocket(runDir)
	ln, err := agentsock.Listen(path)
	if err != nil {
		return err
	}
	a.lan = ctl
	if side != nil {
		if cfg.Pods != nil {
			// A restarted agent has no reports: what its pods hold comes
			// from the LAN pool's store once the informers have them.
			// The first read may precede the host credentials
			// (hostcreds.go): it is tried again until it succeeds.
			wg.Go(func() {
				if !cache.WaitForCacheSync(ctx.Done(), cfg.Pods.HasSynced) {
					return
				}
				for {
					err := ctl.Refresh(ctx)
					if err == nil {
						return
					}
					opts.logf("LAN pods: %v (trying again in %s)", err, hostCredsRetry)
					select {
					case <-ctx.Done():
						return
					case <-time.After(hostCredsRetry):
					}
				}
			})
		}
		if err := startHostCreds(ctx, wg, c, side.rc, side.cs, runDir, opts.logf); err != nil {
			opts.logf("LAN pods: host credentials: %v", err)
		}
	}
	wg.Go(func() { agentsock.Serve(ctx, ln, sockHandler{Controller: ctl, dhcp: dhcp}, opts.logf) })
	opts.logf("LAN pods (%q): answering on %s", lan.Pods, path)
	if dhcp != nil {
		opts.logf("dhcp: serving LAN leases on %s", path)
	}
	if w := lanAllWarning(c); w != "" {
		opts.logf("%s", w)
	}
	return nil
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

// Status is the node's LAN pods, as the running agent knows them (asked
// on its socket).
func (lanPodsFeature) Status(ctx context.Context, v *view) ([]string, bool) {
	return lanStatus(ctx, v.c, v.runDir), true
}

// lanStatus is `villaged status`'s lines about the node's LAN pods; nil
// without a LAN section.
func lanStatus(ctx context.Context, c *Conf, runDir string) []string {
	if c.Net.LAN == nil {
		return nil
	}
	if runDir == "" {
		runDir = nodelocal.RunDir()
	}
	var lines []string
	if w := lanAllWarning(c); w != "" {
		lines = append(lines, "LAN pods: "+w)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := agentsock.Ask(ctx, c.agentSocket(runDir), agentsock.Request{Op: agentsock.OpLANList})
	if err != nil {
		return append(lines, fmt.Sprintf("LAN pods (%q): unknown: %v", c.Net.LAN.Pods, err))
	}
	lines = append(lines, fmt.Sprintf("LAN pods (%q, %d):", c.Net.LAN.Pods, len(resp.Pods)))
	for _, p := range resp.Pods {
		lines = append(lines, fmt.Sprintf("  %s/%s\t%s", p.Namespace, p.Name, p.Addresses))
	}
	return lines
}
