package macvlan

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/owner"
)

// RouteProtocol marks the host shim's routes as Village's (87; the overlay owns 86), so uninstall and
// status can tell them from anyone else's.
const RouteProtocol netlink.RouteProtocol = 0x57

// ShimMetric is the metric of network's host-shim routes: protocol 87 in
// the top byte, the network's owner.Tag below. Two networks with LAN ranges
// on one master share the shim link, and each finds its own routes on it.
func ShimMetric(network string) int { return owner.Metric(uint8(RouteProtocol), network) }

// ShimName is the node-side macvlan for master.
func ShimName(master string) string {
	n := "vshim-" + master
	if len(n) > 15 {
		n = n[:15]
	}
	return n
}

// EnsureShim makes sure the node reaches the pods' LAN addresses: the shim
// macvlan on master (bridge mode, up) and one route per block of the LAN
// ranges through it, with network's metric and the master's current address
// of the block's family as source (an address that changed since, e.g. a
// DHCP renewal, is followed). It changes nothing when all of that is in
// place.
func EnsureShim(master netlink.Link, ranges []cidr.Range, network string) error {
	shim, err := ensureShimLink(master)
	if err != nil {
		return err
	}
	return ensureShimRoutes(master, shim, ranges, network)
}

// RepairShim is EnsureShim for a shim that exists: nothing is made when
// there is none (no pod has asked for it yet).
func RepairShim(master netlink.Link, ranges []cidr.Range, network string) error {
	l, err := netlinksafe.LinkByName(ShimName(master.Attrs().Name))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("failed to look up host shim %q: %w", ShimName(master.Attrs().Name), err)
	}
	if mv, ok := l.(*netlink.Macvlan); !ok || mv.ParentIndex != master.Attrs().Index {
		return nil // not ours; EnsureShim reports it at the next ADD
	}
	if err := ensureShimMAC(l, master); err != nil {
		return err
	}
	return ensureShimRoutes(master, l, ranges, network)
}

func ensureShimRoutes(master, shim netlink.Link, ranges []cidr.Range, network string) error {
	masterAddrs, err := netlinksafe.AddrList(master, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("failed to list addresses of %q: %w", master.Attrs().Name, err)
	}
	have, err := netlinksafe.RouteList(shim, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("failed to list routes of %q: %w", shim.Attrs().Name, err)
	}
	for _, r := range ranges {
		for _, p := range r.Prefixes() {
			if err := ensureShimRoute(shim, p, masterAddrs, have, ShimMetric(network)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ShimMAC is the host shim's MAC: derived from the master's MAC (the shim
// speaks on the LAN, so it must differ between nodes), given at creation
// (so udev's MACAddressPolicy=persistent leaves it alone) and put back by
// every ADD and villaged pass when something changed it.
func ShimMAC(master netlink.Link) net.HardwareAddr {
	return netsetup.DeriveMAC("village host shim " + master.Attrs().HardwareAddr.String())
}

func ensureShimMAC(l, master netlink.Link) error {
	want := ShimMAC(master)
	if bytes.Equal(l.Attrs().HardwareAddr, want) {
		return nil
	}
	if err := netlink.LinkSetHardwareAddr(l, want); err != nil {
		return fmt.Errorf("failed to set MAC %s on host shim %q: %w", want, l.Attrs().Name, err)
	}
	return nil
}

func ensureShimLink(master netlink.Link) (netlink.Link, error) {
	name := ShimName(master.Attrs().Name)
	l, err := netlinksafe.LinkByName(name)
	if err == nil {
		mv, ok := l.(*netlink.Macvlan)
		if !ok || mv.ParentIndex != master.Attrs().Index {
			return nil, fmt.Errorf("host shim %q exists but is not a macvlan on %q: remove it or rename the master", name, master.Attrs().Name)
		}
		if err := ensureShimMAC(l, master); err != nil {
			return nil, err
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(l); err != nil {
				return nil, fmt.Errorf("failed to set host shim %q up: %w", name, err)
			}
		}
		return l, nil
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	attrs.ParentIndex = master.Attrs().Index
	attrs.Flags = net.FlagUp
	attrs.HardwareAddr = ShimMAC(master)
	if err := netlink.LinkAdd(&netlink.Macvlan{LinkAttrs: attrs, Mode: netlink.MACVLAN_MODE_BRIDGE}); err != nil && !errors.Is(err, syscall.EEXIST) {
		return nil, fmt.Errorf("failed to create host shim %q on %q: %w", name, master.Attrs().Name, err)
	}
	l, err = netlinksafe.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("failed to read back host shim %q: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("failed to set host shim %q up: %w", name, err)
	}
	return l, nil
}

func ensureShimRoute(shim netlink.Link, p netip.Prefix, masterAddrs []netlink.Addr, have []netlink.Route, metric int) error {
	dst := cidr.IPNet(p)
	src, subnet := sourceFor(p.Addr(), masterAddrs)
	if subnet != nil {
		if ones, _ := subnet.Mask.Size(); ones >= p.Bits() {
			return fmt.Errorf("host shim: the LAN range block %s is as wide as the LAN subnet %s of the master; set \"rangeStart\"/\"rangeEnd\" to the part of the LAN the pods use", p, subnet)
		}
	}
	var mine bool
	var legacy []netlink.Route
	for _, r := range have {
		if r.Dst == nil || r.Dst.String() != dst.String() || r.Protocol != RouteProtocol {
			continue
		}
		switch r.Priority {
		case metric:
			mine = r.Src.Equal(src)
		case defaultMetric(p.Addr()):
			legacy = append(legacy, r) // made before shim routes carried the network's metric
		}
	}
	if !mine {
		route := &netlink.Route{LinkIndex: shim.Attrs().Index, Dst: dst, Src: src, Scope: netlink.SCOPE_LINK, Protocol: RouteProtocol, Priority: metric}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("failed to route %s through host shim %q (source %v): %w", p, shim.Attrs().Name, src, err)
		}
	}
	for _, r := range legacy {
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("failed to remove the old route %s on host shim %q: %w", p, shim.Attrs().Name, err)
		}
	}
	return nil
}

// defaultMetric is what the kernel stores for a route added without one.
func defaultMetric(ip netip.Addr) int {
	if ip.Is4() {
		return 0
	}
	return 1024
}

// sourceFor picks the master's address (and subnet) of the family of ip, so
// the node's packets to its pods carry its LAN address.
func sourceFor(ip netip.Addr, addrs []netlink.Addr) (net.IP, *net.IPNet) {
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || (a.IP.To4() != nil) != ip.Is4() {
			continue
		}
		subnet := &net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}
		if subnet.Contains(ip.AsSlice()) {
			return a.IP, subnet
		}
	}
	return nil, nil
}
