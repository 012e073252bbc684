package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
)

// SealProtocol marks the unreachable routes that seal clusterCIDR under the
// wireguard backend (87, ASCII 'W'): not the reconciler's RouteProtocol,
// so its passes neither own nor remove them.
const SealProtocol netlink.RouteProtocol = 0x57

// seal keeps, under the wireguard backend, an unreachable route for each
// clusterCIDR network: a packet to another node's pod subnet that has no
// route through the WireGuard device (before the device exists, when it
// cannot be made, for a peer without a key, after a userspace device went
// with the agent) is refused by this node instead of following its
// default route out in the clear. The routes through the device and the
// node's own pod subnet are more specific and win. The route stays when
// the agent stops, as a kernel device does. It is added only when missing
// (a replaced route would be a kernel notification, and a pass).
func (c *Conf) seal() error {
	if c.Backend.Type != netconf.BackendWireGuard {
		return nil
	}
	metric := overlay.Metric(c.Net.Name)
	var errs []error
	for _, n := range c.Net.ClusterNets {
		r := netlink.Route{Dst: n, Type: unix.RTN_UNREACHABLE, Protocol: SealProtocol, Priority: metric}
		family := netlink.FAMILY_V6
		if n.IP.To4() != nil {
			family = netlink.FAMILY_V4
		}
		have, err := netlink.RouteListFiltered(family, &netlink.Route{Dst: n, Protocol: SealProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err == nil && sealed(have, n, metric) {
			continue
		}
		if err := netlink.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("unreachable route %s (sealing clusterCIDR under wireguard): %w", n, err))
		}
	}
	return errors.Join(errs...)
}

func sealed(have []netlink.Route, n *net.IPNet, metric int) bool {
	for _, r := range have {
		if r.Type == unix.RTN_UNREACHABLE && r.Priority == metric && r.Dst != nil && r.Dst.String() == n.String() {
			return true
		}
	}
	return false
}
