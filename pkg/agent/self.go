package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
	"github.com/village-cni/village/pkg/subnetfile"
	"github.com/village-cni/village/pkg/validate"
	"github.com/village-cni/village/pkg/wireguard"
	"github.com/village-cni/village/pkg/wireguard/userspace"
)

// wgID is what a node publishes under the wireguard backend: its public
// key and, when configured, its endpoint (zero for the other backends).
type wgID struct{ key, endpoint string }

// loadWireGuard reads this node's WireGuard public key into c.wg under the
// wireguard backend, making the key file when create (Run; the reconciler
// uses the same file) and leaving the key empty when the file is missing
// and not create (the read-only commands).
func (c *Conf) loadWireGuard(create bool) error {
	w := c.Backend.WireGuard
	if c.Backend.Type != netconf.BackendWireGuard || w == nil {
		return nil
	}
	load := wireguard.LoadKey
	if create {
		load = wireguard.LoadOrCreateKey
	}
	_, pub, err := load(w.KeyPath(c.Net.Name))
	if !create && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backend wireguard of network %q: %w", c.Net.Name, err)
	}
	c.wg = wgID{key: pub.String(), endpoint: w.Endpoint}
	return nil
}

// syncable refuses `villaged sync` where its pass could make a wireguard-go
// device, which would end with the command (and its routes with it).
func (c *Conf) syncable() error {
	if w := c.Backend.WireGuard; c.Backend.Type == netconf.BackendWireGuard && w != nil && w.Userspace != wireguard.UserspaceNever {
		return fmt.Errorf("network %q: villaged sync cannot keep a WireGuard device that may be wireguard-go's (backend.wireguard.userspace %q): it would end with the command; `villaged run` keeps the device (or set userspace \"never\")", c.Net.Name, w.Userspace)
	}
	return nil
}

// record is the registry entry of a node with these attributes.
func record(name string, ip net.IP, cidrs []*net.IPNet, wg wgID) registry.Node {
	n := registry.Node{Name: name, IP: ip.String(), VtepMAC: overlay.DeriveMAC(ip).String(), WireGuardKey: wg.key, WireGuardEndpoint: wg.endpoint}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, c.String())
	}
	return n
}

// overlayNode turns a registry record into a reconciler peer.
func overlayNode(n registry.Node) (overlay.Node, error) {
	o := overlay.Node{Name: n.Name, IP: net.ParseIP(n.IP), WireGuardHub: n.Hub}
	if o.IP == nil {
		return o, fmt.Errorf("node %q: ip %q", n.Name, n.IP)
	}
	if v4 := o.IP.To4(); v4 != nil {
		o.IP = v4
	}
	for _, c := range n.PodCIDRs {
		_, sn, err := net.ParseCIDR(c)
		if err != nil {
			return o, fmt.Errorf("node %q: podCIDR %q: %w", n.Name, c, err)
		}
		o.PodCIDRs = append(o.PodCIDRs, sn)
	}
	if n.VtepMAC != "" {
		mac, err := validate.MAC(n.VtepMAC)
		if err != nil {
			return o, fmt.Errorf("node %q: vtepMAC: %w", n.Name, err)
		}
		o.VtepMAC = mac
	}
	if n.WireGuardKey != "" {
		k, err := wgtypes.ParseKey(n.WireGuardKey)
		if err != nil {
			return o, fmt.Errorf("node %q: wireguardKey: %w", n.Name, err)
		}
		o.WireGuardKey = k
	}
	if n.WireGuardEndpoint != "" {
		ap, err := netip.ParseAddrPort(n.WireGuardEndpoint)
		if err != nil {
			return o, fmt.Errorf("node %q: wireguardEndpoint: %w", n.Name, err)
		}
		o.WireGuardEndpoint = net.UDPAddrFromAddrPort(ap)
	}
	return o, nil
}

// peersOf converts a registry list to reconciler peers, leaving out this
// node and records that do not convert (reported in bad).
func peersOf(nodes []registry.Node, self string) (peers []overlay.Node, bad []error) {
	peers = make([]overlay.Node, 0, len(nodes))
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		o, err := overlayNode(n)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		peers = append(peers, o)
	}
	return peers, bad
}

// mergePeers is the static peers plus the registry's nodes whose names
// are not among them (a static entry wins: it is written by the operator).
func mergePeers(static, fromRegistry []overlay.Node) []overlay.Node {
	out := slices.Clone(static)
	for _, p := range fromRegistry {
		if !slices.ContainsFunc(static, func(s overlay.Node) bool { return s.Name == p.Name }) {
			out = append(out, p)
		}
	}
	return out
}

// staticPeers are the backend's static nodes.
func (c *Conf) staticPeers() []overlay.Node { return c.Backend.Peers() }

// newReconciler opens the reconciler of the backend in this namespace;
// logf receives the WireGuard device's errors (wireguard-go's own, and why
// auto chose it).
func (c *Conf) newReconciler(logf func(format string, args ...any)) (*overlay.Reconciler, error) {
	cfg := c.Backend.OverlayConfig(c.Net.Name)
	// The agent runs a wireguard-go device when the kernel has no
	// WireGuard (the plugin never makes one, and links none).
	cfg.WireGuard.Start = userspace.Start
	cfg.WireGuard.Logf = logf
	r, err := overlay.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("backend %s of network %q: %w", c.Backend.Type, c.Net.Name, err)
	}
	return r, nil
}

// publishedCIDRs reads the subnet file run published, nil when absent.
func (c *Conf) publishedCIDRs() ([]*net.IPNet, error) {
	ps, err := subnetfile.Read(c.SubnetFile)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return cidr.IPNets(ps), nil
}

// publish writes the leased subnets to c.SubnetFile (see subnetfile.Write),
// only when the content changes.
func (c *Conf) publish(cidrs []*net.IPNet) (changed bool, err error) {
	return subnetfile.Write(c.SubnetFile, fmt.Sprintf("pod subnet of node %s in network %s, leased by villaged; read by village-ipam", c.Node, c.Net.Name), cidrs)
}

// podCIDRs are this node's pod subnets for the read-only commands: the
// config's ranges, else what run published, else what the registry says the
// node holds (nil when nothing).
func (c *Conf) podCIDRs(ctx context.Context, src source) ([]*net.IPNet, string, error) {
	if len(c.PodCIDRs) > 0 {
		return c.PodCIDRs, "from the IPAM ranges of " + c.File, nil
	}
	if p, err := c.publishedCIDRs(); err != nil || p != nil {
		return p, "leased, published in " + c.SubnetFile, err
	}
	if src == nil {
		return nil, "", nil
	}
	p, err := src.podCIDRs(ctx, false)
	if err != nil || p == nil {
		return nil, "", err
	}
	return p, "held in the registry, NOT published in " + c.SubnetFile, nil
}
