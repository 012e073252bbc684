package overlay

import (
	"bytes"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// route is a desired peer route.
type route struct {
	peer   string
	dst    *net.IPNet
	gw     net.IP
	link   linkRef
	onlink bool
	metric int // the network's Metric
}

func (rt route) key() string { return rt.dst.String() }

// priority is the route's metric: the network's.
func (rt route) priority() int { return rt.metric }

// defaultPriority is what the kernel stores for a route added without a
// metric, as Village did before routes carried the network's metric.
func defaultPriority(ip net.IP) int {
	if isV4(ip) {
		return 0
	}
	return 1024
}

func (rt route) object() Object {
	desc := fmt.Sprintf("%s via %s dev %s", rt.dst, rt.gw, rt.link.name)
	if rt.gw == nil {
		desc = fmt.Sprintf("%s dev %s", rt.dst, rt.link.name)
	}
	if rt.onlink {
		desc += " onlink"
	}
	return Object{Kind: KindRoute, Desc: desc, Peer: rt.peer}
}

func (rt route) spec() *netlink.Route {
	r := &netlink.Route{
		LinkIndex: rt.link.index,
		Dst:       rt.dst,
		Gw:        rt.gw,
		Protocol:  RouteProtocol,
		Priority:  rt.metric,
		Table:     unix.RT_TABLE_MAIN,
		Type:      unix.RTN_UNICAST,
		Scope:     netlink.SCOPE_UNIVERSE,
	}
	if rt.onlink {
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if rt.gw == nil {
		r.Scope = netlink.SCOPE_LINK // through a point-to-point device
	}
	return r
}

// matches reports whether a kernel route is exactly this one.
func (rt route) matches(k netlink.Route) bool {
	return k.Dst != nil && sameNet(k.Dst, rt.dst) &&
		k.Gw.Equal(rt.gw) && k.LinkIndex == rt.link.index && len(k.MultiPath) == 0 &&
		(k.Flags&int(netlink.FLAG_ONLINK) != 0) == rt.onlink &&
		k.Priority == rt.priority()
}

// sameNet reports whether two prefixes are the same (without formatting
// either).
func sameNet(a, b *net.IPNet) bool {
	ao, ab := a.Mask.Size()
	bo, bb := b.Mask.Size()
	return ao == bo && ab == bb && a.IP.Equal(b.IP)
}

// sameNetOrNil is sameNet where either may be nil (equal only to nil).
func sameNetOrNil(a, b *net.IPNet) bool {
	return a == b || (a != nil && b != nil && sameNet(a, b))
}

// kernelRouteObject names a route found in the kernel.
func kernelRouteObject(k netlink.Route, dev string) Object {
	desc := fmt.Sprintf("%s via %s dev %s metric %d", k.Dst, k.Gw, dev, k.Priority)
	if k.Flags&int(netlink.FLAG_ONLINK) != 0 {
		desc += " onlink"
	}
	return Object{Kind: KindRoute, Desc: desc}
}

// neigh is a desired permanent neighbour entry on the VXLAN device.
type neigh struct {
	peer string
	ip   net.IP
	mac  net.HardwareAddr
	link linkRef
}

func (n neigh) key() string { return n.ip.String() }

func (n neigh) object() Object {
	return Object{Kind: KindNeigh, Desc: fmt.Sprintf("%s lladdr %s dev %s", n.ip, n.mac, n.link.name), Peer: n.peer}
}

func (n neigh) spec() *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    n.link.index,
		Family:       family(n.ip),
		State:        netlink.NUD_PERMANENT,
		IP:           n.ip,
		HardwareAddr: n.mac,
	}
}

func (n neigh) matches(k netlink.Neigh) bool {
	return k.IP.Equal(n.ip) && bytes.Equal(k.HardwareAddr, n.mac) && k.State&netlink.NUD_PERMANENT != 0
}

// fdb is a desired permanent FDB entry on the VXLAN device.
type fdb struct {
	peer string
	mac  net.HardwareAddr
	dst  net.IP
	link linkRef
}

func (f fdb) key() string { return f.mac.String() }

func (f fdb) object() Object {
	return Object{Kind: KindFDB, Desc: fmt.Sprintf("%s dst %s dev %s", f.mac, f.dst, f.link.name), Peer: f.peer}
}

func (f fdb) spec() *netlink.Neigh {
	return fdbSpec(f.link.index, f.mac, f.dst)
}

func fdbSpec(index int, mac net.HardwareAddr, dst net.IP) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    index,
		Family:       unix.AF_BRIDGE,
		Flags:        netlink.NTF_SELF,
		State:        netlink.NUD_PERMANENT,
		IP:           dst,
		HardwareAddr: mac,
	}
}

func (f fdb) matches(k netlink.Neigh) bool {
	return bytes.Equal(k.HardwareAddr, f.mac) && k.IP.Equal(f.dst) && k.State&netlink.NUD_PERMANENT != 0
}

func family(ip net.IP) int {
	if isV4(ip) {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}
