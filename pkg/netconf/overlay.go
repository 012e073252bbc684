package netconf

import "github.com/village-cni/village/pkg/overlay"

// Peers turns the static node list into overlay peers (the plugin's static
// reconcile and villaged's merge with the registry use the same list).
func (b *Backend) Peers() []overlay.Node {
	peers := make([]overlay.Node, 0, len(b.Nodes))
	for _, n := range b.Nodes {
		peers = append(peers, overlay.Node{Name: n.Name, IP: n.Addr, PodCIDRs: n.Subnets})
	}
	return peers
}

// OverlayConfig is the reconciler configuration of the backend section;
// network names the objects' owner (route metric, device alias).
func (b *Backend) OverlayConfig(network string) overlay.Config {
	c := overlay.Config{Mode: overlay.Mode(b.Type), Underlay: b.Underlay, VNI: b.VNI, Port: b.Port, Network: network}
	if b.Type == BackendWireGuard && b.WireGuard != nil {
		c.Port, c.WireGuard = b.WireGuard.Port, b.WireGuard.overlayConfig(network)
	}
	return c
}
