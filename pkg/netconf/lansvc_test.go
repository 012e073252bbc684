package netconf_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/netconf"
)

// macvlan.services: ranges in village-ipam's syntax inside the LAN
// subnet, requireClass, gossipKeyFile, and presence turning the feature
// on.
func TestParseLANServices(t *testing.T) {
	const pool = `"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.100","rangeEnd":"192.168.50.199"}],[{"subnet":"fd00:50::/64"}]]}`
	for _, tc := range []struct {
		name, services string
		wantErr        string // "" : accepted
		wantSets       int
		requireClass   bool
		keyFile        string
	}{
		{name: "absent", services: ``},
		{name: "null", services: `"services":null,`},
		{name: "v4", services: `"services":{"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.250"}]]},`, wantSets: 1},
		{name: "dual stack and class", services: `"services":{"requireClass":true,"ranges":[[{"subnet":"192.168.50.240/28"}],[{"subnet":"fd00:50::/120"}]]},`, wantSets: 2, requireClass: true},
		{name: "overlapping the pod pool is allowed (one store)", services: `"services":{"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.150","rangeEnd":"192.168.50.160"}]]},`, wantSets: 1},
		{name: "no ranges", services: `"services":{},`, wantErr: `"services.ranges" is required`},
		{name: "empty ranges", services: `"services":{"ranges":[]},`, wantErr: `is empty`},
		{name: "outside the LAN subnet", services: `"services":{"ranges":[[{"subnet":"192.168.51.0/24"}]]},`, wantErr: "not inside the LAN subnet"},
		{name: "wider than the LAN subnet", services: `"services":{"ranges":[[{"subnet":"192.168.0.0/16","rangeStart":"192.168.50.2","rangeEnd":"192.168.50.9"}]]},`, wantErr: "not inside the LAN subnet"},
		{name: "v6 outside", services: `"services":{"ranges":[[{"subnet":"fd00:51::/120"}]]},`, wantErr: "not inside the LAN subnet"},
		{name: "bad range (ipam/config's check)", services: `"services":{"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.9","rangeEnd":"192.168.50.2"}]]},`, wantErr: "services"},
		{name: "overlapping sets", services: `"services":{"ranges":[[{"subnet":"192.168.50.240/28"}],[{"subnet":"192.168.50.240/29"}]]},`, wantErr: "overlaps"},
		{name: "not an object", services: `"services":[1],`, wantErr: "services"},
		{name: "gossip key file", services: `"services":{"gossipKeyFile":"/etc/village/gossip/key","ranges":[[{"subnet":"192.168.50.240/28"}]]},`, wantSets: 1, keyFile: "/etc/village/gossip/key"},
		{name: "relative gossip key file", services: `"services":{"gossipKeyFile":"gossip/key","ranges":[[{"subnet":"192.168.50.240/28"}]]},`, wantErr: "absolute path"},
		{name: "requireClass not a bool", services: `"services":{"requireClass":"yes","ranges":[[{"subnet":"192.168.50.240/28"}]]},`, wantErr: "services"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lan, err := netconf.ParseLAN(json.RawMessage(`{"master":"eth0",` + tc.services + pool + `}`))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseLAN = %v; want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantSets == 0 {
				if lan.Services != nil {
					t.Fatalf("services on without the key: %+v", lan.Services)
				}
				return
			}
			if lan.Services == nil || len(lan.Services.Sets) != tc.wantSets || lan.Services.RequireClass != tc.requireClass || lan.Services.GossipKeyFile != tc.keyFile {
				t.Fatalf("Services = %+v; want %d sets, requireClass %v, gossipKeyFile %q", lan.Services, tc.wantSets, tc.requireClass, tc.keyFile)
			}
		})
	}
}

// With a DHCP LAN the addresses belong to the LAN's DHCP server: no store
// for Services to share.
func TestParseLANServicesDHCP(t *testing.T) {
	_, err := netconf.ParseLAN(json.RawMessage(`{"master":"eth0","services":{"ranges":[[{"subnet":"192.168.50.0/24"}]]},"ipam":{"type":"dhcp"}}`))
	if err == nil || !strings.Contains(err.Error(), "dhcp") {
		t.Fatalf("ParseLAN = %v; want a refusal naming dhcp", err)
	}
}
