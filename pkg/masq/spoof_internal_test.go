package masq

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
)

// TestSpoofRecordRoundTrip: what recordSpoof writes parseSpoofRecord reads
// back, for every mix of MAC and addresses; a record of an older release
// (the MAC alone) still reads; broken and empty records are refused.
func TestSpoofRecordRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("0a:58:0a:51:00:02")
	v4, v6 := netip.MustParseAddr("10.81.0.2"), netip.MustParseAddr("fd00::2")
	for _, tc := range []struct {
		name string
		sc   SpoofCheck
		text string
		err  bool
	}{
		{name: "MAC only", sc: SpoofCheck{MAC: mac}},
		{name: "addresses only", sc: SpoofCheck{IPs: []netip.Addr{v4, v6}}},
		{name: "both", sc: SpoofCheck{MAC: mac, IPs: []netip.Addr{v4}}},
		{name: "older release", text: "0a:58:0a:51:00:02", sc: SpoofCheck{MAC: mac}},
		{name: "bad MAC", text: "zz\n10.0.0.1\n", err: true},
		{name: "bad address", text: "\n10.0.0.300\n", err: true},
		{name: "empty", text: "\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := tc.text
			if text == "" {
				dir := t.TempDir()
				t.Setenv("VILLAGE_RUN_DIR", dir)
				sc := tc.sc
				sc.Network, sc.HostVeth = "n", "veth0"
				if err := recordSpoof(sc); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(spoofFile("n", "veth0"))
				if err != nil {
					t.Fatal(err)
				}
				text = string(b)
			}
			got, err := parseSpoofRecord("n", "veth0", []byte(text))
			if tc.err {
				if err == nil {
					t.Fatalf("record %q: want an error, got %+v", text, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("record %q: %v", text, err)
			}
			if got.MAC.String() != tc.sc.MAC.String() || !slices.Equal(got.IPs, tc.sc.IPs) {
				t.Fatalf("record %q read as MAC %s IPs %v, want %s %v", text, got.MAC, got.IPs, tc.sc.MAC, tc.sc.IPs)
			}
		})
	}
}

// TestSpoofRules: a port gets its MAC rule with a MAC, and the IPv4, ARP
// and IPv6 rules with addresses (each family's, whatever the pod has of
// it), in that order.
func TestSpoofRules(t *testing.T) {
	mac, _ := net.ParseMAC("0a:58:0a:51:00:02")
	v4 := netip.MustParseAddr("10.81.0.2")
	for _, tc := range []struct {
		name string
		sc   SpoofCheck
		want int
	}{
		{"nothing", SpoofCheck{}, 0},
		{"MAC", SpoofCheck{MAC: mac}, 1},
		{"IPv4 pod", SpoofCheck{IPs: []netip.Addr{v4}}, 3},
		{"both", SpoofCheck{MAC: mac, IPs: []netip.Addr{v4, netip.MustParseAddr("fd00::2")}}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.sc.HostVeth = "veth0"
			if got := len(tc.sc.rules()); got != tc.want {
				t.Fatalf("%d rules, want %d", got, tc.want)
			}
		})
	}
}
