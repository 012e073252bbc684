package overlay

import (
	"fmt"
	"net"

	"github.com/village-cni/village/pkg/netsetup"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// underlay is the node's interface toward the other nodes.
type underlay struct {
	link  netlink.Link
	ip    net.IP // this node's underlay address (VXLAN local)
	addrs []netlink.Addr
}

func (u underlay) name() string { return u.link.Attrs().Name }
func (u underlay) mtu() int     { return u.link.Attrs().MTU }

// onLink reports whether ip is inside one of the underlay's subnets, i.e. is
// reachable without a router.
func (u underlay) onLink(ip net.IP) bool {
	for _, a := range u.addrs {
		ones, bits := a.Mask.Size()
		if a.Peer == nil && ones < bits && a.Contains(ip) {
			return true
		}
	}
	return false
}

// resolveUnderlay finds the underlay link (by name, or the default route's)
// and this node's address on it (self.IP, or its first global address,
// IPv4 first).
func (r *Reconciler) resolveUnderlay(self Node) (underlay, error) {
	link, err := r.underlayLink()
	if err != nil {
		return underlay{}, err
	}
	addrs, err := r.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return underlay{}, fmt.Errorf("listing addresses of underlay %s: %w", link.Attrs().Name, err)
	}
	u := underlay{link: link, addrs: addrs, ip: self.IP}
	if u.ip == nil {
		u.ip = FirstGlobal(addrs)
	}
	if u.ip == nil {
		return u, fmt.Errorf("%w: underlay %s has no global address; give the node's IP", ErrConfig, u.name())
	}
	if !u.hasAddr(u.ip) {
		return u, fmt.Errorf("%w: node %s address %s is not on underlay %s", ErrConfig, self.Name, u.ip, u.name())
	}
	return u, nil
}

// Underlay is this node's underlay interface and its address toward the
// other nodes, as Set resolves them when self has no address: the
// configured interface (or the default route's) and its first global
// address, IPv4 first (in 4 bytes). The agent registers that address.
func (r *Reconciler) Underlay() (name string, ip net.IP, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return "", nil, errClosed
	}
	u, err := r.resolveUnderlay(Node{})
	if err != nil {
		return "", nil, err
	}
	if v4 := u.ip.To4(); v4 != nil {
		return u.name(), v4, nil
	}
	return u.name(), u.ip, nil
}

func (u underlay) hasAddr(ip net.IP) bool {
	for _, a := range u.addrs {
		if a.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// FirstGlobal is the node address Village takes from an underlay's
// addresses: the first global IPv4 one, else the first global IPv6 one, nil
// when there is none.
func FirstGlobal(addrs []netlink.Addr) net.IP {
	var v6 net.IP
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || a.IP.IsLinkLocalUnicast() {
			continue
		}
		if a.IP.To4() != nil {
			return a.IP
		}
		if v6 == nil {
			v6 = a.IP
		}
	}
	return v6
}

func (r *Reconciler) underlayLink() (netlink.Link, error) {
	if r.cfg.Underlay != "" {
		link, err := r.h.LinkByName(r.cfg.Underlay)
		if err != nil {
			return nil, fmt.Errorf("%w: underlay interface %s: %w", ErrConfig, r.cfg.Underlay, err)
		}
		return link, nil
	}
	link, _, err := netsetup.DefaultRouteLink(r.h)
	if err != nil {
		return nil, err
	}
	if link != nil {
		return link, nil
	}
	return nil, fmt.Errorf("%w: no default route to find the underlay interface; set underlay", ErrConfig)
}
