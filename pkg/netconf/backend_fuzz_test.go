package netconf_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
)

// FuzzParseBackend feeds arbitrary bytes to the backend section parser:
// every rejection is a CNI config error (code 7), and everything accepted
// is safe to hand to the kernel (valid link names, VNI and port in range,
// nodes with an address and subnets, an absolute registry prefix).
func FuzzParseBackend(f *testing.F) {
	for _, s := range []string{
		``, `null`, `{}`, `{"type":"none"}`,
		`{"type":"vxlan","underlay":"eth0","vni":1,"port":4789,"nodes":[{"name":"node2","ip":"192.168.50.11","podCIDR":"10.244.2.0/24"}]}`,
		`{"type":"host-gw","nodes":[{"name":"a","ip":"fd00::1","podCIDRs":["10.244.3.0/24","fd44::/64"]}]}`,
		`{"type":"auto","registry":{"type":"etcd","endpoints":["https://127.0.0.1:2379"],"prefix":"/village","ttl":60,"subnetLen":24}}`,
		`{"type":"vxlan","vni":16777216}`, `{"type":"vxlan","vni":12345678}`, `{"type":"vxlan","port":-1}`, `{"type":"vxlan","underlay":"eth0\u0000x"}`,
		`{"type":"host-gw","nodes":[{"name":"a","ip":"fe80::1%eth0","podCIDR":"10.0.0.0/24"}]}`,
		`{"type":"host-gw","nodes":[{"name":"a","ip":"10.0.0.1","podCIDR":"10.0.0.1/24"}]}`,
		`{"registry":{"endpoints":["http://x"],"prefix":"/../x"}}`,
		`{"type":"vxlan","registry":{"type":"kubernetes","kubeconfig":"/etc/village/kubeconfig"}}`,
		`{"registry":{"type":"kubernetes","endpoints":["http://x"]}}`,
		`{"type":"frob"}`, `[`, `"vxlan"`,
		`{"type":"wireguard","registry":{"type":"kubernetes"},"wireguard":{"port":51821,"keyFile":"/var/lib/village/wg.key","persistentKeepalive":"10s","userspace":"always","endpoint":"203.0.113.7:51820"}}`,
		`{"type":"wireguard","registry":{"type":"kubernetes"},"wireguard":{"persistentKeepalive":-1,"endpoint":"x:1"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := netconf.ParseBackend(json.RawMessage(raw))
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("error %v (%T) is not a CNI config error", err, err)
			}
			if b != nil {
				t.Fatal("both a backend and an error")
			}
			return
		}
		switch b.Type {
		case string(overlay.ModeNone), string(overlay.ModeVXLAN), string(overlay.ModeHostGW), string(overlay.ModeAuto), string(overlay.ModeWireGuard):
		default:
			t.Fatalf("accepted backend type %q", b.Type)
		}
		if b.Underlay != "" && !validIfName(b.Underlay) {
			t.Fatalf("accepted underlay %q, not a valid interface name", b.Underlay)
		}
		if b.VNI < 0 || b.VNI > 1<<24-1 || b.Port < 0 || b.Port > 65535 {
			t.Fatalf("accepted vni %d port %d", b.VNI, b.Port)
		}
		if err := b.OverlayConfig("n").Validate(); err != nil {
			t.Fatalf("accepted a backend the reconciler rejects: %v", err)
		}
		for _, n := range b.Nodes {
			if n.Addr == nil || len(n.Subnets) == 0 || n.Name == "" || strings.ContainsAny(n.Name, "/\x00") {
				t.Fatalf("accepted node %+v", n)
			}
			for _, s := range n.Subnets {
				if s == nil || !s.IP.Equal(s.IP.Mask(s.Mask)) {
					t.Fatalf("accepted subnet %v of node %q", s, n.Name)
				}
			}
		}
		if r := b.Registry; r != nil && r.Type == netconf.RegistryKubernetes {
			if len(r.Endpoints) > 0 || r.CAFile != "" || r.CertFile != "" || r.KeyFile != "" {
				t.Fatalf("accepted kubernetes registry with etcd settings %+v", r)
			}
		} else if r != nil {
			if r.Type != netconf.RegistryEtcd || r.Kubeconfig != "" || !strings.HasPrefix(r.Prefix, "/") || strings.Contains(r.Prefix, "..") || len(r.Endpoints) == 0 {
				t.Fatalf("accepted registry %+v", r)
			}
		}
	})
}
