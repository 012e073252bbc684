package agent

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netsetup"
)

// Orphans lists what Village made on this node that nothing wants any
// more, each line naming the object and why it is an orphan:
//
//   - allocations of the network's disk store whose pod is gone: neither
//     the deterministic host veth of the attachment nor a live pod holding
//     the address behind another plugin's veth exists (a DEL that never
//     came); `GC` from the runtime, or a DEL, releases them;
//   - host veths Village made (owner tag) on the network's bridge that no
//     allocation accounts for;
//   - netfilter objects of any Village network that nothing uses, in
//     both backends (masq.Orphans: chains nothing jumps to, an empty
//     table, macspoofchk rules of gone host veths);
//   - this network's host-shim routes (protocol 87, its metric) outside
//     every LAN range of the config.
//
// foreign lists what is on the network's bridge or in its store but was not
// made by Village: pods another plugin made (the reference bridge before a
// migration, with the same bridge and data directory). They are reported,
// not orphans: their plugin's DEL removes them.
//
// Stale overlay routes, neighbour and FDB entries are reported by the
// overlay's own status. Nothing here changes anything.
//
// Only allocations inside this node's pod subnets (podCIDRs) are looked at:
// the others belong to the node that holds those subnets.
func (c *Conf) Orphans(podCIDRs []*net.IPNet) (orphans, foreign []string, err error) {
	allocs, err := c.allocations(podCIDRs)
	if err != nil {
		return nil, nil, err
	}
	ports, err := c.bridgePorts()
	if err != nil {
		return nil, nil, err
	}
	accounted := map[string]bool{}
	for _, al := range allocs {
		accounted[al.veth] = true
	}
	var others []netlink.Link
	for _, p := range ports {
		switch {
		case netsetup.MadeByVillage(p) || accounted[p.Attrs().Name]:
			if !accounted[p.Attrs().Name] {
				orphans = append(orphans, fmt.Sprintf("host veth %s on bridge %s: no allocation of network %s accounts for it", p.Attrs().Name, c.Net.Bridge, c.Net.Name))
			}
		default:
			others = append(others, p)
		}
	}
	behind := addrsBehind(others)
	for _, p := range others {
		foreign = append(foreign, fmt.Sprintf("host veth %s on bridge %s (pod addresses %s): made by another plugin", p.Attrs().Name, c.Net.Bridge, strings.Join(behind.of(p.Attrs().Name), ", ")))
	}
	for _, al := range allocs {
		if _, err := netlinksafe.LinkByName(al.veth); !netsetup.IsNotFound(err) {
			continue // the attachment's veth is there: a live Village pod
		}
		if veth, ok := behind.byIP[al.ip]; ok {
			foreign = append(foreign, fmt.Sprintf("allocation %s of container %s interface %s: held by a live pod behind %s, made by another plugin", al.ip, al.id, al.ifname, veth))
			continue
		}
		orphans = append(orphans, fmt.Sprintf("allocation %s of container %s interface %s: its host veth %s is gone (a DEL that never came; GC or DEL releases it)", al.ip, al.id, al.ifname, al.veth))
	}
	orphans = append(orphans, masq.Orphans()...)
	shim, err := c.orphanShimRoutes()
	if err != nil {
		return nil, nil, err
	}
	return append(orphans, shim...), foreign, nil
}

// allocation is one record of the disk store.
type allocation struct {
	ip, id, ifname string
	veth           string // the host veth Village would have made for it
}

// allocations reads the disk store's records in podCIDRs through its
// read-only listing (disk.Peek: no lock taken).
func (c *Conf) allocations(podCIDRs []*net.IPNet) ([]allocation, error) {
	held, err := disk.Peek(c.DataDir, c.Net.Name, true)
	if err != nil {
		return nil, err
	}
	var out []allocation
	for _, r := range held {
		ip := net.IP(r.IP.AsSlice())
		if !slices.ContainsFunc(podCIDRs, func(n *net.IPNet) bool { return n.Contains(ip) }) {
			continue
		}
		id, ifname := r.Owner.ContainerID, r.Owner.IfName
		if r.Corrupt || ifname == "" || (c.Net.LAN != nil && ifname == c.Net.LAN.IfName) {
			continue // unreadable or released while we looked, a legacy record without ifname, or a LAN address
		}
		out = append(out, allocation{ip: r.IP.String(), id: id, ifname: ifname, veth: netsetup.HostVethName(id, ifname)})
	}
	return out, nil
}

// bridgePorts are the veths on the network's bridge (none without one).
func (c *Conf) bridgePorts() ([]netlink.Link, error) {
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
	var out []netlink.Link
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && l.Type() == "veth" {
			out = append(out, l)
		}
	}
	return out, nil
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
