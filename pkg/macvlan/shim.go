package macvlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteProtocol marks the host shim's routes as Village's (87; the overlay owns 86), so uninstall and
// status can tell them from anyone else's.
const RouteProtocol netlink.RouteProtocol = 0x57

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
// ranges through it. It changes nothing when all of that is in place.
func EnsureShim(master netlink.Link, ranges []Range) error {
	shim, err := ensureShimLink(master)
	if err != nil {
		return err
	}
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
			if err := ensureShimRoute(shim, p, masterAddrs, have); err != nil {
				return err
			}
		}
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

func ensureShimRoute(shim netlink.Link, p netip.Prefix, masterAddrs []netlink.Addr, have []netlink.Route) error {
	dst := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	for _, r := range have {
		if r.Dst != nil && r.Dst.String() == dst.String() {
			return nil
		}
	}
	src, subnet := sourceFor(p.Addr(), masterAddrs)
	if subnet != nil {
		if ones, _ := subnet.Mask.Size(); ones >= p.Bits() {
			return fmt.Errorf("host shim: the LAN range block %s is as wide as the LAN subnet %s of the master; set \"rangeStart\"/\"rangeEnd\" to the part of the LAN the pods use", p, subnet)
		}
	}
	route := &netlink.Route{LinkIndex: shim.Attrs().Index, Dst: dst, Src: src, Scope: netlink.SCOPE_LINK, Protocol: RouteProtocol}
	if err := netlink.RouteAdd(route); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("failed to route %s through host shim %q: %w", p, shim.Attrs().Name, err)
	}
	return nil
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

// RemoveShim deletes the host shim of master (uninstall). Missing is fine.
func RemoveShim(master string) error {
	l, err := netlinksafe.LinkByName(ShimName(master))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("failed to delete host shim %q: %w", l.Attrs().Name, err)
	}
	return nil
}
