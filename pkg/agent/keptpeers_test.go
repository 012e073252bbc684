package agent

import (
	"net"
	"os"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/overlay"
)

// TestKeptPeersRoundTrip: the kept file holds the registry's peers of the
// view (every field the reconciler uses, both families, a WireGuard key
// and endpoint), not the static ones, and is read back only by the same
// node and network.
func TestKeptPeersRoundTrip(t *testing.T) {
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	cidr := func(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }
	reg := []overlay.Node{
		{Name: "a", IP: net.ParseIP("192.0.2.1").To4(), PodCIDRs: []*net.IPNet{cidr("10.1.1.0/24"), cidr("fd01:1::/64")},
			VtepMAC: net.HardwareAddr{0x0e, 0, 0, 0, 0, 1}},
		{Name: "b", IP: net.ParseIP("2001:db8::2"), PodCIDRs: []*net.IPNet{cidr("10.1.2.0/24")},
			WireGuardKey: key.PublicKey(), WireGuardEndpoint: &net.UDPAddr{IP: net.ParseIP("203.0.113.7"), Port: 51820}},
	}
	static := netconf.StaticNode{Name: "s", IP: "192.0.2.9", Addr: net.ParseIP("192.0.2.9"), Subnets: []*net.IPNet{cidr("10.1.9.0/24")}}
	nc := &netconf.NetConf{}
	nc.Name = "net1"
	b := &netconf.Backend{Nodes: []netconf.StaticNode{static}}
	dir := t.TempDir()
	a := &agent{c: &Conf{Node: "me", Net: nc, Backend: b}, opts: Options{RunDir: dir, Logf: t.Logf}}
	a.view = peerMap(mergePeers(a.c.staticPeers(), reg))
	a.writeKept()
	if fi, err := os.Stat(nodelocal.OverlayPeers(dir, "net1")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kept file: %v, %v (want mode 0600)", fi, err)
	}
	got, _, err := a.readKept()
	// The reconciler's own comparison: nothing to change between them.
	if d := overlay.Diff(reg, got); err != nil || len(got) != len(reg) || !d.Empty() {
		t.Fatalf("read back %+v (%v), want the registry's peers %+v; the difference: %+v", got, err, reg, d)
	}
	for _, other := range []*agent{
		{c: &Conf{Node: "another", Net: nc, Backend: b}, opts: a.opts},
		{c: &Conf{Node: "me", Net: &netconf.NetConf{}, Backend: b}, opts: a.opts},
	} {
		if got, _, err := other.readKept(); got != nil || err != nil {
			t.Fatalf("node %q network %q read another's kept peers: %+v, %v", other.c.Node, other.c.Net.Name, got, err)
		}
	}
}
