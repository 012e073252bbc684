package agent

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/registry"
	"github.com/village-cni/village/pkg/wireguard"
)

// Under the wireguard backend the agent publishes the public key of the
// key file (made by run, only read by the read-only commands) and the
// configured endpoint, and a peer's record becomes a peer with its key
// and endpoint.
func TestAgentWireGuardIdentity(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "wg", "agt.key")
	list := `{"cniVersion":"1.1.0","name":"agt","plugins":[
	{"type":"village","clusterCIDR":"10.70.0.0/16","ipam":{"type":"village-ipam"},
	 "backend":{"type":"wireguard","underlay":"lan0","registry":{"type":"kubernetes"},
	            "wireguard":{"keyFile":"` + key + `","endpoint":"203.0.113.7:51820"}}}]}`
	c, err := Load(Options{ConfFile: write(t, "10-agt.conflist", list), NodeName: "n1", RunDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.loadWireGuard(false); err != nil || c.wg != (wgID{}) {
		t.Fatalf("read-only with no key file: %+v %v, want nothing and no file made", c.wg, err)
	}
	if _, err := os.Stat(key); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the read-only load made the key file: %v", err)
	}
	if err := c.loadWireGuard(true); err != nil {
		t.Fatal(err)
	}
	_, pub, err := wireguard.LoadKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if c.wg.key != pub.String() || c.wg.endpoint != "203.0.113.7:51820" {
		t.Fatalf("identity %+v, want key %s", c.wg, pub)
	}
	if err := c.syncable(); err == nil || !strings.Contains(err.Error(), "villaged sync cannot keep") {
		t.Fatalf("sync under userspace auto: %v, want refused", err)
	}
	c.Backend.WireGuard.Userspace = wireguard.UserspaceNever
	if err := c.syncable(); err != nil {
		t.Fatalf("sync under userspace never: %v", err)
	}
	rec := record("n1", net.ParseIP("192.0.2.9"), nil, c.wg)
	if rec.WireGuardKey != pub.String() || rec.WireGuardEndpoint != "203.0.113.7:51820" || rec.Validate() != nil {
		t.Fatalf("record %+v", rec)
	}
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.loadWireGuard(true); err == nil || !strings.Contains(err.Error(), "mode 0644") {
		t.Fatalf("a key file others can read: %v, want refused", err)
	}

	peers, bad := peersOf([]registry.Node{
		{Name: "a", IP: "192.0.2.1", PodCIDRs: []string{"10.70.1.0/24"}, WireGuardKey: pub.String(), WireGuardEndpoint: "[2001:db8::1]:51900"},
		{Name: "b", IP: "192.0.2.2", PodCIDRs: []string{"10.70.2.0/24"}},
		{Name: "c", IP: "192.0.2.3", PodCIDRs: []string{"10.70.3.0/24"}, WireGuardKey: "nope"},
	}, "n1")
	if len(peers) != 2 || len(bad) != 1 {
		t.Fatalf("peers %+v bad %v", peers, bad)
	}
	if peers[0].WireGuardKey != pub || peers[0].WireGuardEndpoint.String() != "[2001:db8::1]:51900" {
		t.Fatalf("peer a: key %s endpoint %v", peers[0].WireGuardKey, peers[0].WireGuardEndpoint)
	}
	if peers[1].WireGuardEndpoint != nil || peers[1].WireGuardKey != (wgtypes.Key{}) {
		t.Fatalf("peer b has no key nor endpoint: %+v", peers[1])
	}
}
