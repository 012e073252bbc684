package cidr_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/village-cni/village/pkg/cidr"
)

func TestNetworkAndFirstHost(t *testing.T) {
	for _, tc := range []struct {
		addr, subnet, first string
	}{
		{"10.1.2.3/24", "10.1.2.0/24", "10.1.2.1"},
		{"10.1.2.255/24", "10.1.2.0/24", "10.1.2.1"},
		{"10.1.2.3/32", "10.1.2.3/32", "10.1.2.4"},
		{"192.168.7.130/25", "192.168.7.128/25", "192.168.7.129"},
		{"fd00:1:2::42/64", "fd00:1:2::/64", "fd00:1:2::1"},
		{"2001:db8::ff/120", "2001:db8::/120", "2001:db8::1"},
	} {
		ip, n, err := net.ParseCIDR(tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		a := &net.IPNet{IP: ip, Mask: n.Mask} // a 16-byte IPv4 address, as JSON decoding gives
		if got := cidr.Network(a).String(); got != tc.subnet {
			t.Errorf("Network(%s) = %s, want %s", tc.addr, got, tc.subnet)
		}
		if got := cidr.FirstHost(a).String(); got != tc.first {
			t.Errorf("FirstHost(%s) = %s, want %s", tc.addr, got, tc.first)
		}
	}
}

func TestLastNetworkBroadcast(t *testing.T) {
	for _, tc := range []struct {
		prefix, last string
		v4           bool
	}{
		{"10.1.2.0/24", "10.1.2.255", true},
		{"10.1.2.128/25", "10.1.2.255", true},
		{"10.1.2.7/32", "10.1.2.7", true},
		{"fd00::/120", "fd00::ff", false},
		{"fd00:1:2::/64", "fd00:1:2:0:ffff:ffff:ffff:ffff", false},
	} {
		p := netip.MustParsePrefix(tc.prefix)
		last := cidr.Last(p)
		if last.String() != tc.last {
			t.Errorf("Last(%s) = %s, want %s", tc.prefix, last, tc.last)
		}
		if cidr.IsBroadcast(p, last) != tc.v4 {
			t.Errorf("IsBroadcast(%s, %s) = %v, want %v (IPv6 has none)", tc.prefix, last, !tc.v4, tc.v4)
		}
		if !cidr.IsNetwork(p, p.Masked().Addr()) || (p.Bits() < p.Addr().BitLen() && cidr.IsNetwork(p, last)) {
			t.Errorf("IsNetwork(%s) wrong", tc.prefix)
		}
	}
}
