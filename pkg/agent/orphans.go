package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/netsetup"
)

// Orphans lists what Village owns on this node that nothing wants any more,
// each line naming the object and why it is an orphan:
//
//   - allocations of the network's disk store whose pod interface is gone
//     (the deterministic host veth of the attachment does not exist): a DEL
//     that never came; `GC` from the runtime, or a DEL, releases them;
//   - host veths on the network's bridge that no allocation accounts for;
//   - masquerade chains (VLG-MASQ-*) that no POSTROUTING rule jumps to;
//   - host-shim routes (protocol 87) outside every LAN range of the config.
//
// Stale overlay routes, neighbour and FDB entries are reported by the
// overlay's own status. Nothing here changes anything.
//
// Only allocations inside this node's pod subnets (podCIDRs) are looked at:
// the others belong to the node that holds those subnets.
func (c *Conf) Orphans(podCIDRs []*net.IPNet) ([]string, error) {
	var out []string
	allocated, lines, err := c.orphanAllocations(podCIDRs)
	if err != nil {
		return nil, err
	}
	out = append(out, lines...)
	vethLines, err := c.orphanVeths(allocated)
	if err != nil {
		return nil, err
	}
	out = append(out, vethLines...)
	out = append(out, orphanChains()...)
	shim, err := c.orphanShimRoutes()
	if err != nil {
		return nil, err
	}
	return append(out, shim...), nil
}

// orphanAllocations reads the disk store (host-local's layout: a file per
// address holding "<containerID>\r\n<ifname>") without taking its lock; it
// returns the host veth names the allocations account for.
func (c *Conf) orphanAllocations(podCIDRs []*net.IPNet) (map[string]bool, []string, error) {
	dir := filepath.Join(c.DataDir, c.Net.Name)
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the allocations in %s: %w", dir, err)
	}
	allocated := map[string]bool{}
	var lines []string
	for _, e := range entries {
		ip := net.ParseIP(e.Name())
		if ip == nil || !e.Type().IsRegular() || !slices.ContainsFunc(podCIDRs, func(n *net.IPNet) bool { return n.Contains(ip) }) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // released while we looked
		}
		id, ifname, ok := strings.Cut(strings.TrimSpace(string(b)), "\r\n")
		if !ok || (c.Net.LAN != nil && ifname == c.Net.LAN.IfName) {
			continue // a legacy record without ifname, or a LAN address
		}
		veth := netsetup.HostVethName(id, ifname)
		allocated[veth] = true
		if _, err := netlinksafe.LinkByName(veth); netsetup.IsNotFound(err) {
			lines = append(lines, fmt.Sprintf("allocation %s of container %s interface %s: its host veth %s is gone (a DEL that never came; GC or DEL releases it)", e.Name(), id, ifname, veth))
		}
	}
	return allocated, lines, nil
}

func (c *Conf) orphanVeths(allocated map[string]bool) ([]string, error) {
	br, err := netlinksafe.LinkByName(c.Net.Bridge)
	if netsetup.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up bridge %s: %w", c.Net.Bridge, err)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var lines []string
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex != br.Attrs().Index || l.Type() != "veth" || !strings.HasPrefix(a.Name, "veth") || allocated == nil || allocated[a.Name] {
			continue
		}
		lines = append(lines, fmt.Sprintf("host veth %s on bridge %s: no allocation of network %s accounts for it", a.Name, c.Net.Bridge, c.Net.Name))
	}
	return lines, nil
}

// orphanChains finds masquerade chains of any Village network that nothing
// jumps to (their network's rules were removed, the chain was not).
func orphanChains() []string {
	var lines []string
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(10))
		if err != nil {
			continue
		}
		chains, err := ipt.ListChains("nat")
		if err != nil {
			continue
		}
		rules, _ := ipt.List("nat", "POSTROUTING")
		for _, ch := range chains {
			if !strings.HasPrefix(ch, "VLG-MASQ-") {
				continue
			}
			if !slices.ContainsFunc(rules, func(r string) bool { return strings.HasSuffix(r, "-j "+ch) }) {
				lines = append(lines, fmt.Sprintf("masquerade chain %s (%s nat): no POSTROUTING rule jumps to it", ch, map[iptables.Protocol]string{iptables.ProtocolIPv4: "iptables", iptables.ProtocolIPv6: "ip6tables"}[proto]))
			}
		}
	}
	return lines
}

// orphanShimRoutes finds this network's host-shim routes (protocol 87 and
// the network's metric) that no LAN range of the config covers; other
// networks' shim routes are theirs to judge.
func (c *Conf) orphanShimRoutes() ([]string, error) {
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: macvlan.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("listing host-shim routes: %w", err)
	}
	var wanted []string
	if c.Net.LAN != nil {
		for _, r := range c.Net.LAN.Ranges {
			for _, p := range r.Prefixes() {
				wanted = append(wanted, p.String())
			}
		}
	}
	var lines []string
	for _, r := range routes {
		if r.Dst == nil || r.Priority != macvlan.ShimMetric(c.Net.Name) || slices.Contains(wanted, r.Dst.String()) {
			continue
		}
		lines = append(lines, fmt.Sprintf("host-shim route %s (protocol 87): outside every LAN range of %s", r.Dst, c.File))
	}
	return lines, nil
}
