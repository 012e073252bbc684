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
//
// Under any other backend, and for a network no longer in clusterCIDR,
// this network's seal routes (its metric) are removed: a node moved from
// wireguard to vxlan or host-gw would otherwise refuse traffic to pod
// subnets that have no node yet, and keep a route nobody owns. Reading
// the routes back costs a dump of the main table, so under the other
// backends that sweep runs once, at the agent's first pass (a backend
// changes only with a restart); under wireguard on every pass, as the
// seal's own check always did.
func (c *Conf) seal(first bool) error {
	var want []*net.IPNet
	if c.Backend.Type == netconf.BackendWireGuard {
		want = c.Net.ClusterNets
	} else if !first {
		return nil
	}
	metric := overlay.Metric(c.Net.Name)
	var errs []error
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := netlink.RouteListFiltered(family, &netlink.Route{Protocol: SealProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing seal routes (protocol %d): %w", SealProtocol, err))
			continue
		}
		// Add before removing: a clusterCIDR that changed is sealed anew
		// before the old one goes.
		for _, n := range want {
			if (n.IP.To4() != nil) != (family == netlink.FAMILY_V4) || sealed(have, n, metric) {
				continue
			}
			r := netlink.Route{Dst: n, Type: unix.RTN_UNREACHABLE, Protocol: SealProtocol, Priority: metric}
			if err := netlink.RouteReplace(&r); err != nil {
				errs = append(errs, fmt.Errorf("unreachable route %s (sealing clusterCIDR under wireguard): %w", n, err))
			}
		}
		for _, r := range have {
			if r.Priority != metric || r.Dst == nil || wanted(want, r.Dst) {
				continue
			}
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("removing seal route %s (not sealed under backend %q): %w", r.Dst, c.Backend.Type, err))
			}
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

func wanted(want []*net.IPNet, dst *net.IPNet) bool {
	for _, n := range want {
		if n.String() == dst.String() {
			return true
		}
	}
	return false
}
