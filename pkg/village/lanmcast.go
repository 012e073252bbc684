package village

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
)

// lanMulticast is the IPv4 multicast range: a LAN pod sends it out of its
// LAN interface.
var lanMulticast = &net.IPNet{IP: net.IPv4(224, 0, 0, 0).To4(), Mask: net.CIDRMask(4, 32)}

// ensureLANMulticast routes the pod's IPv4 multicast (mDNS, SSDP: the
// discovery protocols a home-lab pod speaks) through its LAN interface
// when it has an IPv4 LAN address. Without the route, an application that
// names no interface for its multicast (many SSDP and mDNS libraries)
// follows the default route to eth0's bridge, where nobody listens.
// IPv6 link-local groups (ff02::fb) name their interface by zone anyway.
func (a *adder) ensureLANMulticast(link netlink.Link, ips []*current.IPConfig) error {
	if !familyHas(ips, true) {
		return nil
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: lanMulticast, Scope: netlink.SCOPE_LINK}
	if err := a.pod.Handle().RouteReplace(r); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("failed to route IPv4 multicast through %q: %w", link.Attrs().Name, err)
	}
	return nil
}
