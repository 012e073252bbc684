package netconf_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/netconf"
)

// A "dhcp" LAN IPAM block: no ranges needed unless the host shim must
// route the pods' addresses; its socket path must be absolute.
func TestLANDHCP(t *testing.T) {
	for _, tc := range []struct {
		section, socket, err string
	}{
		{section: `{"ipam":{"type":"dhcp"}}`},
		{section: `{"ipam":{"type":"dhcp","daemonSocketPath":"/run/x/dhcp.sock"}}`, socket: "/run/x/dhcp.sock"},
		{section: `{"ipam":{"type":"dhcp","daemonSocketPath":"run/dhcp.sock"}}`, err: "absolute"},
		{section: `{"ipam":{"type":"dhcp","daemonSocketPath":7}}`, err: "daemonSocketPath"},
		{section: `{"hostShim":true,"ipam":{"type":"dhcp"}}`, err: "ipam.ranges"},
		{section: `{"hostShim":true,"ipam":{"type":"dhcp","ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.100","rangeEnd":"192.168.50.199"}]]}}`},
	} {
		lan, err := netconf.ParseLAN(json.RawMessage(tc.section))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one naming %q", tc.section, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.section, err)
			continue
		}
		if lan.IPAMType != netconf.LANDHCP || lan.DHCPSocket != tc.socket {
			t.Errorf("%s: type %q socket %q, want dhcp %q", tc.section, lan.IPAMType, lan.DHCPSocket, tc.socket)
		}
	}
}
