package netconf_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/netconf"
)

// The host shim routes the LAN ranges ParseLAN derives; they must be exactly
// the ranges village-ipam hands out, or the shim misses pods' addresses
// (IPv6 once stopped one address short: no broadcast address there).
func TestLANRangesMatchIPAM(t *testing.T) {
	for _, r := range []string{
		`{"subnet":"192.168.50.0/24"}`,
		`{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200"}`,
		`{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.250"}`,
		`{"subnet":"fd00:50::/120"}`,
		`{"subnet":"fd00:50::/64","rangeStart":"fd00:50::100"}`,
		`{"subnet":"fd00:50::/64","rangeStart":"fd00:50::100","rangeEnd":"fd00:50::1ff"}`,
	} {
		ipam := fmt.Sprintf(`{"type":"village-ipam","ranges":[[%s]]}`, r)
		lan, err := netconf.ParseLAN(json.RawMessage(`{"master":"eth0","ipam":` + ipam + `}`))
		if err != nil || lan == nil || len(lan.Ranges) != 1 {
			t.Fatalf("%s: ParseLAN = %+v, %v", r, lan, err)
		}
		c, err := config.Parse([]byte(`{"cniVersion":"1.0.0","name":"lan","ipam":`+ipam+`}`), "")
		if err != nil || len(c.RangeSets) != 1 || len(c.RangeSets[0]) != 1 {
			t.Fatalf("%s: config.Parse = %+v, %v", r, c, err)
		}
		want := c.RangeSets[0][0]
		if got := lan.Ranges[0]; got.Start != want.RangeStart || got.End != want.RangeEnd {
			t.Errorf("%s: the shim routes %s-%s, village-ipam hands out %s", r, got.Start, got.End, want)
		}
	}
}

// A LAN range village-ipam would refuse is refused by ParseLAN too: both
// read it through ipam/config.
func TestLANRangesValidatedAsIPAM(t *testing.T) {
	for _, ipam := range []string{
		`{"type":"village-ipam","subnet":"192.168.50.7/24"}`,                                               // host bits
		`{"type":"village-ipam","subnet":"192.168.50.0/31"}`,                                               // too small
		`{"type":"village-ipam","rangeStart":"192.168.50.9"}`,                                              // no subnet
		`{"type":"village-ipam","ranges":[[{"rangeStart":"192.168.50.9"}]]}`,                               // no subnet
		`{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24"}],[{"subnet":"192.168.50.0/25"}]]}`, // overlap
		`{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.51.1"}]]}`,    // outside
	} {
		if _, err := netconf.ParseLAN(json.RawMessage(`{"master":"eth0","ipam":` + ipam + `}`)); err == nil {
			t.Errorf("ParseLAN accepted %s", ipam)
		}
		if _, err := config.Parse([]byte(`{"cniVersion":"1.0.0","name":"lan","ipam":`+ipam+`}`), ""); err == nil {
			t.Errorf("config.Parse accepted %s", ipam)
		}
	}
}
