package netconf_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
)

// FuzzParseLAN feeds arbitrary macvlan sections to the parser: rejections are
// CNI config errors, and what it accepts names valid links, a known mode, a unicast MAC and ordered, zone-free ranges.
func FuzzParseLAN(f *testing.F) {
	for _, raw := range []string{
		``, `null`,
		`{"master":"eth0","mode":"bridge","ifName":"net1","hostShim":true,"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.250","gateway":"192.168.50.1"}]]}}`,
		`{"ipam":{"type":"host-local","subnet":"fd50::/64"},"mtu":1500,"mac":"0a:58:0a:f4:01:05"}`,
		`{"ifName":"eth0","ipam":{"type":"x","subnet":"10.0.0.0/24"}}`,
		`{"master":"eth0\u0000x","ipam":{"type":"x","subnet":"10.0.0.0/24"}}`,
		`{"ipam":{"type":"x","subnet":"10.0.0.0/24","rangeStart":"10.0.0.9","rangeEnd":"10.0.0.2"}}`,
		`{"ipam":{"type":"x","subnet":"fe80::/64","rangeStart":"fe80::5%eth0"}}`,
		`{"ipam":{"type":"x","subnet":"10.0.0.0/24","rangeStart":"fd00::1"}}`,
		`{"mode":"vepa","mtu":-5,"ipam":{"type":"x"}}`,
		`{"mac":"01:00:5e:00:00:01","ipam":{"type":"x","subnet":"10.0.0.0/24"}}`,
		`{"ipam":{}}`, `[`,
		`{"master":"eth0","services":{"requireClass":true,"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.250"}]]},"ipam":{"type":"village-ipam","subnet":"192.168.50.0/24"}}`,
		`{"services":{"ranges":[[{"subnet":"fd00:51::/120"}]]},"ipam":{"type":"x","subnet":"fd00:50::/64"}}`,
	} {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := netconf.ParseLAN(json.RawMessage(raw))
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("error %v (%T) is not a CNI config error", err, err)
			}
			return
		}
		if c == nil {
			return // no section
		}
		if !validIfName(c.IfName) {
			t.Fatalf("accepted ifName %q", c.IfName)
		}
		if c.Master != "" && !validIfName(c.Master) {
			t.Fatalf("accepted master %q", c.Master)
		}
		if c.MTU < 0 || (c.MTU > 0 && c.MTU < 68) || c.MTU > 65535 {
			t.Fatalf("accepted mtu %d", c.MTU)
		}
		if c.HWAddr != nil && (len(c.HWAddr) != 6 || c.HWAddr[0]&1 != 0) {
			t.Fatalf("accepted MAC %v", c.HWAddr)
		}
		if s := c.Services; s != nil {
			for _, set := range s.Sets {
				for _, r := range set {
					in := false
					for _, lset := range c.Sets {
						for _, l := range lset {
							in = in || (l.Subnet.Bits() <= r.Subnet.Bits() && l.Subnet.Contains(r.RangeStart) && l.Subnet.Contains(r.RangeEnd))
						}
					}
					if !in || r.RangeEnd.Less(r.RangeStart) {
						t.Fatalf("accepted Service range %s outside the LAN subnets", r)
					}
				}
			}
		}
		if c.IPAMType == "" {
			t.Fatal("accepted an ipam block without a type")
		}
		for _, r := range c.Ranges {
			if !r.Start.IsValid() || r.Start.Zone() != "" || r.End.Zone() != "" || r.End.Less(r.Start) || r.Start.Is4() != r.End.Is4() {
				t.Fatalf("accepted range %v-%v", r.Start, r.End)
			}
			if len(r.Prefixes()) == 0 {
				t.Fatalf("range %v-%v covers no prefix", r.Start, r.End)
			}
		}
	})
}
