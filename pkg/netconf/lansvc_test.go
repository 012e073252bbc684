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
		{name: "holding the default gateway", services: `"services":{"ranges":[[{"subnet":"192.168.50.0/24","gateway":"192.168.50.254","rangeStart":"192.168.50.1","rangeEnd":"192.168.50.9"}]]},`, wantErr: "holds the LAN gateway 192.168.50.1"},
		{name: "the subnet's own first address is not handed out", services: `"services":{"ranges":[[{"subnet":"192.168.50.0/24","rangeEnd":"192.168.50.9"}]]},`, wantSets: 1},
		{name: "v6 holding the default gateway", services: `"services":{"ranges":[[{"subnet":"fd00:50::/64","gateway":"fd00:50::ff","rangeStart":"fd00:50::1","rangeEnd":"fd00:50::9"}]]},`, wantErr: "holds the LAN gateway fd00:50::1"},
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

// With an explicit LAN gateway (the router), a Service range around it is
// refused; one beside it is not.
func TestParseLANServicesGateway(t *testing.T) {
	const pool = `"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24","gateway":"192.168.50.254","rangeStart":"192.168.50.100","rangeEnd":"192.168.50.199"}]]}`
	for _, tc := range []struct{ name, ranges, wantErr string }{
		{"around the router", `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.254"}]]`, "holds the LAN gateway 192.168.50.254"},
		{"the router as the whole range", `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.254","rangeEnd":"192.168.50.254"}]]`, "holds the LAN gateway 192.168.50.254"},
		{"beside the router", `[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.253"}]]`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := netconf.ParseLAN(json.RawMessage(`{"master":"eth0","services":{"ranges":` + tc.ranges + `},` + pool + `}`))
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ParseLAN = %v; want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// LAN Services allocate in the LAN pool's store: under the kubernetes
// registry (several nodes) a disk store would let each node allocate
// alone, and is refused; the shared stores, and a disk store without a
// shared registry, are not.
func TestParseLANServicesStore(t *testing.T) {
	const services = `"services":{"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.250"}]]}`
	for _, tc := range []struct{ name, backend, store, wantErr string }{
		{"disk store, kubernetes registry", `"backend":{"type":"vxlan","registry":{"type":"kubernetes"}},`, `"store":{"type":"disk"},`, `store of type "disk" under the "kubernetes" registry`},
		{"default (disk) store, kubernetes registry", `"backend":{"type":"vxlan","registry":{"type":"kubernetes"}},`, ``, `store of type "disk" under the "kubernetes" registry`},
		{"kubernetes store, kubernetes registry", `"backend":{"type":"vxlan","registry":{"type":"kubernetes"}},`, `"store":{"type":"kubernetes"},`, ""},
		{"disk store, no registry", ``, `"store":{"type":"disk"},`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := `{"cniVersion":"1.0.0","name":"village","type":"village",` + tc.backend + `"macvlan":{"master":"eth0",` + services +
				`,"ipam":{"type":"village-ipam",` + tc.store + `"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.100","rangeEnd":"192.168.50.199"}]]}}}`
			_, err := netconf.Parse([]byte(conf), "")
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Parse = %v; want an error with %q", err, tc.wantErr)
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
