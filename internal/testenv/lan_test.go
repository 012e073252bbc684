package testenv

import (
	"net/netip"
	"testing"
	"time"
)

// TestNeighbourAnswers: ARPAnswers and NDPAnswers see exactly the MAC of
// the host holding an address, and nothing for an address nobody holds.
func TestNeighbourAnswers(t *testing.T) {
	RequireRoot(t)
	l := NewLAN(t)
	holder := l.Host("eth0", "10.77.0.1/24", "fd00:77::1/64")
	asker := l.Host("eth0", "10.77.0.2/24", "fd00:77::2/64")
	for _, tc := range []struct {
		ip   string
		want []string
		ask  func(netip.Addr) ([]string, error)
	}{
		{"10.77.0.1", []string{holder.MAC.String()}, func(ip netip.Addr) ([]string, error) { return ARPAnswers(asker.NS, "eth0", ip, time.Second) }},
		{"10.77.0.9", nil, func(ip netip.Addr) ([]string, error) { return ARPAnswers(asker.NS, "eth0", ip, time.Second) }},
		{"fd00:77::1", []string{holder.MAC.String()}, func(ip netip.Addr) ([]string, error) { return NDPAnswers(asker.NS, "eth0", ip, time.Second) }},
		{"fd00:77::9", nil, func(ip netip.Addr) ([]string, error) { return NDPAnswers(asker.NS, "eth0", ip, time.Second) }},
	} {
		got, err := tc.ask(netip.MustParseAddr(tc.ip))
		if err != nil {
			t.Fatalf("%s: %v", tc.ip, err)
		}
		if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
			t.Errorf("answers for %s: %v, want %v", tc.ip, got, tc.want)
		}
	}
}
