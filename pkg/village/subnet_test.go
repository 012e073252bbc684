package village

import (
	"net"
	"testing"
)

func TestSubnetOfAndFirstHost(t *testing.T) {
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
		if got := subnetOf(a).String(); got != tc.subnet {
			t.Errorf("subnetOf(%s) = %s, want %s", tc.addr, got, tc.subnet)
		}
		if got := firstHost(a).String(); got != tc.first {
			t.Errorf("firstHost(%s) = %s, want %s", tc.addr, got, tc.first)
		}
	}
}
