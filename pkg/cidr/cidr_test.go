package cidr_test

import (
	"fmt"
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

func TestRangePrefixes(t *testing.T) {
	for _, tc := range []struct {
		start, end string
		want       string
	}{
		{"192.168.50.1", "192.168.50.254", "[192.168.50.1/32 192.168.50.2/31 192.168.50.4/30 192.168.50.8/29 192.168.50.16/28 192.168.50.32/27 192.168.50.64/26 192.168.50.128/26 192.168.50.192/27 192.168.50.224/28 192.168.50.240/29 192.168.50.248/30 192.168.50.252/31 192.168.50.254/32]"},
		{"192.168.50.200", "192.168.50.207", "[192.168.50.200/29]"},
		{"10.0.0.5", "10.0.0.5", "[10.0.0.5/32]"},
		{"fd50::", "fd50::ff", "[fd50::/120]"},
		{"255.255.255.254", "255.255.255.255", "[255.255.255.254/31]"},
	} {
		r := cidr.Range{Start: netip.MustParseAddr(tc.start), End: netip.MustParseAddr(tc.end)}
		if got := fmt.Sprint(r.Prefixes()); got != tc.want {
			t.Errorf("%s-%s: Prefixes = %s, want %s", tc.start, tc.end, got, tc.want)
		}
	}
}

func TestLastHost(t *testing.T) {
	for prefix, want := range map[string]string{
		"10.1.2.0/24":   "10.1.2.254", // the broadcast address is no host
		"10.1.2.128/25": "10.1.2.254",
		"fd00::/120":    "fd00::ff", // IPv6 has no broadcast address
		"fd00:1:2::/64": "fd00:1:2:0:ffff:ffff:ffff:ffff",
	} {
		if got := cidr.LastHost(netip.MustParsePrefix(prefix)); got.String() != want {
			t.Errorf("LastHost(%s) = %s, want %s", prefix, got, want)
		}
	}
}

func TestIPNet(t *testing.T) {
	for _, s := range []string{"10.1.2.3/24", "10.0.0.0/8", "192.0.2.1/32", "2001:db8::5/64", "::/0", "0.0.0.0/0"} {
		p := netip.MustParsePrefix(s)
		got := cidr.IPNet(p)
		if got.String() != s {
			t.Errorf("IPNet(%s) = %s", s, got)
		}
		ones, bits := got.Mask.Size()
		if ones != p.Bits() || bits != p.Addr().BitLen() || len(got.IP) != p.Addr().BitLen()/8 {
			t.Errorf("IPNet(%s): mask %d/%d, IP length %d", s, ones, bits, len(got.IP))
		}
	}
}
