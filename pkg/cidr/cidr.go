// Package cidr is the address arithmetic Village's packages share: the
// network, first host and last address of a prefix, and which addresses of
// a subnet are not hosts. It uses the standard library only, not
// containernetworking/plugins/pkg/ip: that package links knftables and
// google/nftables, whose package initialisation (regular expressions
// compiled at start-up) every exec of a plugin would pay for a few helpers.
package cidr

import (
	"net"
	"net/netip"
)

// IPNet is p as a *net.IPNet, its address kept as is (10.1.2.3/24 stays
// 10.1.2.3/24, what a CNI result's address and netlink want): the one
// conversion from the netip form the allocator and ranges use.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// IPNets is IPNet of every prefix, in order.
func IPNets(ps []netip.Prefix) []*net.IPNet {
	out := make([]*net.IPNet, 0, len(ps))
	for _, p := range ps {
		out = append(out, IPNet(p))
	}
	return out
}

// Network is the network of an address with its mask (10.1.2.3/24 ->
// 10.1.2.0/24).
func Network(a *net.IPNet) *net.IPNet {
	return &net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}
}

// FirstHost is the address after the network address of a's subnet: the
// gateway the reference bridge picks when IPAM names none.
func FirstHost(a *net.IPNet) net.IP {
	n, ok := netip.AddrFromSlice(Network(a).IP)
	if !ok {
		return nil
	}
	return net.IP(n.Next().AsSlice())
}

// IsNetwork reports whether a is p's network address.
func IsNetwork(p netip.Prefix, a netip.Addr) bool { return a == p.Masked().Addr() }

// IsBroadcast reports whether a is the broadcast address of the IPv4
// prefix p (IPv6 has none).
func IsBroadcast(p netip.Prefix, a netip.Addr) bool {
	return p.Addr().Is4() && a == Last(p)
}

// Last is the highest address of p.
func Last(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// LastHost is the highest address of p a host may have, the default end of
// a range in host-local and village-ipam: IPv4's last address is the
// broadcast address and is left out, IPv6 has no broadcast address.
func LastHost(p netip.Prefix) netip.Addr {
	last := Last(p)
	if p.Addr().Is4() {
		return last.Prev()
	}
	return last
}

// Range is an inclusive address range of one family.
type Range struct{ Start, End netip.Addr }

// Prefixes returns the smallest set of CIDR blocks that covers r exactly.
func (r Range) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	cur := r.Start
	for {
		bits := cur.BitLen()
		// Grow the block while it stays aligned and inside the range.
		best := netip.PrefixFrom(cur, bits)
		for l := bits - 1; l >= 0; l-- {
			p := netip.PrefixFrom(cur, l).Masked()
			if p.Addr() != cur || r.End.Less(Last(p)) {
				break
			}
			best = p
		}
		out = append(out, best)
		last := Last(best)
		if last == r.End || !last.Next().IsValid() {
			return out
		}
		cur = last.Next()
	}
}
