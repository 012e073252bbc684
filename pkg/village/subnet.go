package village

import (
	"net"
	"net/netip"
)

// subnetOf is the network of an address with its mask (10.1.2.3/24 ->
// 10.1.2.0/24). It and firstHost use the standard library, not
// containernetworking/plugins/pkg/ip: that package links knftables and
// google/nftables, whose package initialisation (regular expressions
// compiled at start-up) every exec of village would pay for two helpers.
func subnetOf(a *net.IPNet) *net.IPNet {
	return &net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}
}

// firstHost is the address after the network address of a's subnet: the
// gateway the reference bridge picks when IPAM names none.
func firstHost(a *net.IPNet) net.IP {
	n, ok := netip.AddrFromSlice(subnetOf(a).IP)
	if !ok {
		return nil
	}
	return net.IP(n.Next().AsSlice())
}
