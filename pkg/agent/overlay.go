package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

// overlayFeature is the overlay: this node's routes, neighbour and FDB
// entries (or WireGuard peers) toward every other node, from the registry
// or the static peers. Start starts the kernel watch (kernel.go), the
// registry's follower and keeper (source.go) and the loop (run.go), which
// is the reconciler's one caller; with static peers it runs the first pass
// (the sweep) before it returns. The loop asks the masquerade keeper
// (masquerade.go, started before it) for a pass at the first peer list,
// every safety net and, on a legacy iptables host, every tick. It needs
// the underlay address and the pod subnets (a.self), so it is the last
// feature Run starts.
type overlayFeature struct{}

func (overlayFeature) Name() string { return "overlay" }

func (overlayFeature) Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error {
	c, src, opts := a.c, a.n.src, a.opts
	ip, cidrs := a.self.IP, a.self.PodCIDRs
	kernel := make(chan struct{}, 1)
	a.watch = newKernelWatch(a.r, kernel, opts.logf)
	a.watch.shim = c.Net.LAN != nil && c.Net.LAN.HostShim
	wg.Go(func() { a.watch.run(ctx) })

	var feed *registry.Feed
	var records chan registry.Node
	a.view = peerMap(c.staticPeers())
	if src != nil {
		feed = registry.NewFeed()
		records = make(chan registry.Node, 1)
		first := record(c.Node, ip, cidrs, c.wg)
		wg.Go(func() { src.follow(ctx, first, records, feed, a.m, opts.logf) })
		opts.logf("node %s: %s, pods %s; registering in %s", c.Node, ip, cidrList(cidrs), src.where())
		if es, ok := src.(*etcdSource); ok {
			a.reclaim = newReclaimer(c, es.reg, opts.logf) // the etcd registry's departed nodes
			a.lease = es.lease
		}
	} else {
		a.haveView = true
		opts.logf("node %s: %s, pods %s; %d static peers, no registry", c.Node, ip, cidrList(cidrs), len(a.view))
		a.pass(ctx, "start (sweep)", false)
		a.masq.keep()
	}
	wg.Go(func() { a.loop(ctx, feed, records, kernel) })
	return nil
}

// Status is the device, this node, its registration and each peer with
// whether its route, neighbour and FDB entries are in place, and the
// stale entries, read from the kernel against the view (writing nothing).
func (overlayFeature) Status(ctx context.Context, v *view) ([]string, bool) {
	c := v.c
	d, err := v.r.Status(ctx, v.self, v.peers)
	if err != nil {
		return []string{fmt.Sprintf("overlay: reading the kernel state of node %s: %v", c.Node, err)}, false
	}
	ok := d.Clean()
	header := fmt.Sprintf("network %s: backend %s", c.Net.Name, c.Backend.Type)
	if d.Device != "" {
		header += fmt.Sprintf(", device %s", d.Device)
	}
	header += fmt.Sprintf(", underlay %s, pod MTU %d", d.Underlay, c.Net.PodMTU(d.MTU))
	lines := []string{header, fmt.Sprintf("node %s: %s, pod subnets %s (%s)", c.Node, v.self.IP, cidrList(v.self.PodCIDRs), v.selfSrc)}
	if v.src != nil {
		want := record(c.Node, v.self.IP, v.self.PodCIDRs, c.wg)
		if v.registered != nil {
			want.Hub = v.registered.Hub // the admin's label, not the agent's to publish
		}
		switch {
		case v.registered == nil:
			ok = false
			lines = append(lines, fmt.Sprintf("registry %s: NOT REGISTERED (is `villaged run` running?)", v.src.where()))
		case !v.registered.Equal(want):
			ok = false
			lines = append(lines, fmt.Sprintf("registry %s: registered as %+v, but this node is %+v", v.src.where(), *v.registered, want))
		default:
			lines = append(lines, fmt.Sprintf("registry %s: registered (revision %d)", v.src.where(), v.rev))
		}
		if v.bad != nil {
			lines = append(lines, fmt.Sprintf("registry: ignored records: %v", v.bad))
		}
	}
	byPeer := map[string][]string{}
	var device, stale []string
	for _, ch := range d.Changes {
		switch {
		case ch.Object.Peer != "":
			byPeer[ch.Object.Peer] = append(byPeer[ch.Object.Peer], describe(ch))
		case ch.Op == overlay.OpDelete:
			stale = append(stale, ch.Object.String())
		default:
			device = append(device, describe(ch))
		}
	}
	for _, p := range d.Problems {
		if peer := p.Change.Object.Peer; peer != "" {
			byPeer[peer] = append(byPeer[peer], "problem: "+p.Err.Error())
		} else {
			device = append(device, "problem: "+p.Err.Error())
		}
	}
	// A static list names every node, this one too; it is not its own peer.
	peers := slices.DeleteFunc(slices.Clone(v.peers), func(p overlay.Node) bool {
		return p.Name == v.self.Name || p.IP.Equal(v.self.IP)
	})
	slices.SortFunc(peers, func(a, b overlay.Node) int { return strings.Compare(a.Name, b.Name) })
	okState := "ok: route, neighbour and FDB entries in place"
	if c.Backend.Type == netconf.BackendHostGW {
		okState = "ok: route in place"
	}
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 2, 8, 2, ' ', 0)
	for _, p := range peers {
		state := okState
		if len(byPeer[p.Name]) > 0 {
			state = "DRIFT"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Name, p.IP, cidrList(p.PodCIDRs), state)
		for _, line := range byPeer[p.Name] {
			fmt.Fprintf(tw, "  \t\t\t  %s\n", line)
		}
	}
	tw.Flush()
	lines = append(lines, fmt.Sprintf("peers (%d):", len(peers)))
	if table.Len() > 0 {
		lines = append(lines, strings.Split(strings.TrimSuffix(table.String(), "\n"), "\n")...)
	}
	for _, line := range device {
		lines = append(lines, "device: "+line)
	}
	for _, line := range stale {
		lines = append(lines, "stale (owned, not wanted): "+line)
	}
	return lines, ok
}

// describe says what a change would fix, in words: "missing route ...".
func describe(ch overlay.Change) string {
	obj := string(ch.Object.Kind) + " " + ch.Object.Desc
	switch ch.Op {
	case overlay.OpAdd:
		return "missing " + obj
	case overlay.OpReplace:
		return "wrong " + obj
	default:
		return string(ch.Op) + " " + obj
	}
}
