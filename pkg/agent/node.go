package agent

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

// node is what run, sync and status start from, assembled one way: the
// village entry of the conflist, the reconciler of its backend (whose
// underlay lookup is this node's address), and the registry (nil without
// one). Run waits and retries where sync and status fail at once, but
// both build this node and its peer set with the same calls.
type node struct {
	c   *Conf
	r   *overlay.Reconciler
	src source
	// side is the Kubernetes side (kube.go), made on first use; sideErr
	// says why there is none.
	side    *kubeSide
	sideErr error
	// resync is how often the kubernetes registry feeds the whole peer
	// list again from its informer's cache (no request), so that a change
	// lost on its way to the loop is repaired within it: the safety net
	// (Options.SafetyNet).
	resync time.Duration
	// metrics says the agent serves metrics: the side takes the Pod
	// informer for the per-pod traffic (kubeSide.take).
	metrics bool
}

// openNode loads opts.ConfFile and opens the reconciler and the registry.
// A configuration that can never give this node a pod subnet is refused
// here: no IPAM range and no registry, or an etcd registry without a
// subnet space to lease from.
func openNode(opts Options) (*node, error) {
	c, err := Load(opts)
	if err != nil {
		return nil, err
	}
	r, err := c.newReconciler(opts.Logf)
	if err != nil {
		return nil, err
	}
	n := &node{c: c, r: r, resync: opts.safetyNet(), metrics: opts.MetricsAddr != ""}
	if n.src, err = n.openSource(); err != nil {
		r.Close()
		return nil, err
	}
	switch {
	case len(c.PodCIDRs) > 0:
	case n.src == nil:
		n.close()
		return nil, fmt.Errorf("%s: the IPAM block names no range and the backend has no registry to lease one from", c.File)
	case c.Registry().Type == netconf.RegistryEtcd:
		if _, err := c.subnetSpace(); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

func (n *node) close() {
	if n.src != nil {
		n.src.close()
	}
	if n.side != nil {
		n.side.shutdown()
	}
	n.r.Close()
}

// underlayIP is this node's address toward the other nodes (the overlay's
// own lookup, so the registered address is the one Set uses).
func (n *node) underlayIP() (net.IP, error) {
	_, ip, err := n.r.Underlay()
	return ip, err
}

// self is this node as the overlay sees it.
func (n *node) self(ip net.IP, cidrs []*net.IPNet) overlay.Node {
	return overlay.Node{Name: n.c.Node, IP: ip, PodCIDRs: cidrs}
}

// peers is the peer set of a registry list: the static peers, plus the
// registry's nodes other than this one whose names are not among them;
// records that do not convert are left out and returned in bad.
func (n *node) peers(nodes []registry.Node) (peers []overlay.Node, bad []error) {
	fromReg, bad := peersOf(nodes, n.c.Node)
	return mergePeers(n.c.staticPeers(), fromReg), bad
}

// applyBatch makes view (the peers by name, static ones included) what
// the registry batch b says and returns the change, with the records that
// do not convert (their names leave the view). A batch of changes costs
// the names it holds: only their old and new records are compared, by
// overlay.Diff. A full batch compares every registry peer. This node and
// the static peers' names are never taken from the registry.
func (n *node) applyBatch(view map[string]overlay.Node, b registry.Batch) (overlay.PeerChange, []error) {
	static := peerMap(n.c.staticPeers())
	ours := func(name string) bool { _, ok := static[name]; return !ok && name != n.c.Node }
	var before, after []overlay.Node
	var bad []error
	drop := func(name string) {
		if p, ok := view[name]; ok {
			before = append(before, p)
			delete(view, name)
		}
	}
	if b.Full {
		for name := range view {
			if ours(name) {
				drop(name)
			}
		}
	}
	for _, name := range b.Removed {
		if ours(name) {
			drop(name)
		}
	}
	for _, rec := range b.Nodes {
		if !ours(rec.Name) {
			continue
		}
		drop(rec.Name)
		p, err := overlayNode(rec)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		view[p.Name] = p
		after = append(after, p)
	}
	return overlay.Diff(before, after), bad
}

// peerMap is peers by name (the first of a name wins, as in mergePeers).
func peerMap(peers []overlay.Node) map[string]overlay.Node {
	m := make(map[string]overlay.Node, len(peers))
	for _, p := range peers {
		if _, ok := m[p.Name]; !ok {
			m[p.Name] = p
		}
	}
	return m
}

// peerList is the view as the list Set takes, in name order.
func peerList(view map[string]overlay.Node) []overlay.Node {
	return slices.SortedFunc(maps.Values(view), func(a, b overlay.Node) int { return strings.Compare(a.Name, b.Name) })
}
