package netconf_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
)

func TestWireGuardBackend(t *testing.T) {
	const reg = `"registry":{"type":"kubernetes"}`
	for _, tc := range []struct {
		name string
		raw  string
		err  string         // substring of the error; "" accepts
		want overlay.Config // for accepted ones: OverlayConfig("net1")
	}{
		{name: "defaults", raw: `{"type":"wireguard",` + reg + `}`, want: overlay.Config{
			Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
			WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 25 * time.Second, Userspace: "auto"}}},
		{name: "everything set", raw: `{"type":"wireguard","underlay":"eth1",` + reg + `,"wireguard":{"port":51900,"keyFile":"/etc/village/wg.key","persistentKeepalive":"10s","userspace":"always","endpoint":"203.0.113.7:51900"}}`,
			want: overlay.Config{Mode: overlay.ModeWireGuard, Underlay: "eth1", Port: 51900, Network: "net1",
				WireGuard: overlay.WireGuardConfig{KeyFile: "/etc/village/wg.key", PersistentKeepalive: 10 * time.Second, Userspace: "always"}}},
		{name: "keepalive in seconds, 0 for none", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"persistentKeepalive":0,"userspace":"never"}}`,
			want: overlay.Config{Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
				WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", Userspace: "never"}}},
		{name: "keepalive as a number", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"persistentKeepalive":15}}`,
			want: overlay.Config{Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
				WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 15 * time.Second, Userspace: "auto"}}},
		{name: "IPv6 endpoint", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"endpoint":"[2001:db8::7]:51820"}}`,
			want: overlay.Config{Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
				WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 25 * time.Second, Userspace: "auto"}}},
		{name: "auto with encrypt is wireguard", raw: `{"type":"auto","encrypt":true,` + reg + `}`, want: overlay.Config{
			Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
			WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 25 * time.Second, Userspace: "auto"}}},
		{name: "auto with encrypt takes the wireguard section", raw: `{"type":"auto","encrypt":true,` + reg + `,"wireguard":{"userspace":"never"}}`, want: overlay.Config{
			Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
			WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 25 * time.Second, Userspace: "never"}}},
		{name: "wireguard with encrypt", raw: `{"type":"wireguard","encrypt":true,` + reg + `}`, want: overlay.Config{
			Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
			WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 25 * time.Second, Userspace: "auto"}}},
		{name: "auto with encrypt and no registry", raw: `{"type":"auto","encrypt":true}`, err: `needs a "registry"`},
		{name: "auto with encrypt and static nodes", raw: `{"type":"auto","encrypt":true,` + reg + `,"nodes":[{"name":"a","ip":"192.168.1.2","podCIDR":"10.244.2.0/24"}]}`, err: `"backend.nodes"`},
		{name: "vxlan with encrypt", raw: `{"type":"vxlan","encrypt":true,` + reg + `}`, err: `"backend.encrypt"`},
		{name: "host-gw with encrypt", raw: `{"type":"host-gw","encrypt":true,` + reg + `}`, err: `"backend.encrypt"`},
		{name: "no registry", raw: `{"type":"wireguard"}`, err: `needs a "registry"`},
		{name: "static nodes", raw: `{"type":"wireguard",` + reg + `,"nodes":[{"name":"a","ip":"192.168.1.2","podCIDR":"10.244.2.0/24"}]}`, err: `"backend.nodes"`},
		{name: "vxlan port", raw: `{"type":"wireguard",` + reg + `,"port":51820}`, err: `"backend.wireguard.port"`},
		{name: "vni", raw: `{"type":"wireguard",` + reg + `,"vni":2}`, err: `no VNI`},
		{name: "section with another type", raw: `{"type":"vxlan",` + reg + `,"wireguard":{}}`, err: `only for backend type "wireguard"`},
		{name: "port out of range", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"port":65536}}`, err: `"backend.wireguard.port" 65536`},
		{name: "negative port", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"port":-1}}`, err: `"backend.wireguard.port" -1`},
		{name: "relative key file", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"keyFile":"wg.key"}}`, err: `"backend.wireguard.keyFile"`},
		{name: "unclean key file", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"keyFile":"/etc/../wg.key"}}`, err: `"backend.wireguard.keyFile"`},
		{name: "negative keepalive", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"persistentKeepalive":"-5s"}}`, err: `"backend.wireguard.persistentKeepalive"`},
		{name: "fractional keepalive", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"persistentKeepalive":"1.5s"}}`, err: `whole seconds`},
		{name: "huge keepalive", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"persistentKeepalive":70000}}`, err: `whole seconds`},
		{name: "keepalive garbage", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"persistentKeepalive":"soon"}}`, err: `invalid "backend"`},
		{name: "userspace unknown", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"userspace":"sometimes"}}`, err: `"backend.wireguard.userspace"`},
		{name: "hubs", raw: `{"type":"wireguard","registry":{"type":"etcd","endpoints":["http://127.0.0.1:2379"]},"wireguard":{"hubs":["vps","vps-2"]}}`,
			want: overlay.Config{Mode: overlay.ModeWireGuard, Port: 51820, Network: "net1",
				WireGuard: overlay.WireGuardConfig{KeyFile: "/var/lib/village/wireguard/net1.key", PersistentKeepalive: 25 * time.Second, Userspace: "auto", Hubs: []string{"vps", "vps-2"}}}},
		{name: "hub not a node name", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"hubs":["a/b"]}}`, err: `"backend.wireguard.hubs"`},
		{name: "endpoint a name", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"endpoint":"node1.example:51820"}}`, err: `"backend.wireguard.endpoint"`},
		{name: "endpoint without port", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"endpoint":"203.0.113.7"}}`, err: `"backend.wireguard.endpoint"`},
		{name: "key rotation too often", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"keyRotation":"30s"}}`, err: `"backend.wireguard.keyRotation" 30s`},
		{name: "key rotation negative", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"keyRotation":-60}}`, err: `"backend.wireguard.keyRotation"`},
		{name: "endpoint port 0", raw: `{"type":"wireguard",` + reg + `,"wireguard":{"endpoint":"203.0.113.7:0"}}`, err: `"backend.wireguard.endpoint"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := netconf.ParseBackend(json.RawMessage(tc.raw))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one mentioning %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := b.OverlayConfig("net1")
			if got.Mode != tc.want.Mode || got.Underlay != tc.want.Underlay || got.Port != tc.want.Port || got.Network != tc.want.Network ||
				got.WireGuard.KeyFile != tc.want.WireGuard.KeyFile || got.WireGuard.PersistentKeepalive != tc.want.WireGuard.PersistentKeepalive ||
				got.WireGuard.Userspace != tc.want.WireGuard.Userspace {
				t.Fatalf("OverlayConfig = %+v, want %+v", got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("the reconciler rejects it: %v", err)
			}
		})
	}
}

func TestWireGuardEndpoint(t *testing.T) {
	b, err := netconf.ParseBackend(json.RawMessage(`{"type":"wireguard","registry":{"type":"kubernetes"},"wireguard":{"endpoint":"203.0.113.7:51900"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if ep := b.WireGuard.EndpointAddr; ep == nil || ep.String() != "203.0.113.7:51900" {
		t.Fatalf("endpoint parsed as %v", ep)
	}
}

func TestWireGuardKeyRotation(t *testing.T) {
	for raw, want := range map[string]time.Duration{
		`{}`:                     0,
		`{"keyRotation":0}`:      0,
		`{"keyRotation":"720h"}`: 720 * time.Hour,
		`{"keyRotation":60}`:     time.Minute,
	} {
		b, err := netconf.ParseBackend(json.RawMessage(`{"type":"wireguard","registry":{"type":"kubernetes"},"wireguard":` + raw + `}`))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if got := b.WireGuard.Rotation(); got != want {
			t.Errorf("%s: rotation %v, want %v", raw, got, want)
		}
	}
}
