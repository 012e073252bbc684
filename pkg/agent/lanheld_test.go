package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
)

// TestLANHeldJoinsStores: the LAN addresses the agent reports come from
// the node's two stores (the network's: a pod address's sandbox; the LAN
// pool's: that sandbox's net1 addresses), here both disk stores, the LAN
// pool's in its own dataDir; a sandbox without a LAN address, and a LAN
// address of another interface, give nothing.
func TestLANHeldJoinsStores(t *testing.T) {
	mainDir, lanDir := t.TempDir(), t.TempDir()
	conf := `{"cniVersion":"1.1.0","name":"lan","plugins":[{"type":"village","clusterCIDR":"10.70.0.0/16",` +
		`"ipam":{"type":"village-ipam","dataDir":"` + mainDir + `","ranges":[[{"subnet":"10.70.1.0/24"}]]},` +
		`"macvlan":{"master":"eth0","pods":"annotated","ipam":{"type":"village-ipam","dataDir":"` + lanDir + `",` +
		`"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.250"}]]}}}]}`
	c, err := Load(Options{ConfFile: write(t, "10-lan.conflist", conf), NodeName: "n1", RunDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(dir, ip, cid, ifName string) {
		t.Helper()
		s, err := disk.New(disk.Options{DataDir: dir, Network: "lan"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if ok, err := s.Claim(context.Background(), store.Claim{IP: netip.MustParseAddr(ip), Owner: store.Owner{ContainerID: cid, IfName: ifName}}); err != nil || !ok {
			t.Fatalf("claiming %s: %v %v", ip, ok, err)
		}
	}
	claim(mainDir, "10.70.1.5", "sandbox-a", "eth0")
	claim(mainDir, "10.70.1.6", "sandbox-b", "eth0")
	claim(lanDir, "192.168.50.210", "sandbox-a", "net1")
	claim(lanDir, "192.168.50.211", "sandbox-b", "net9")
	held := c.lanHeld(t.TempDir())
	if held == nil {
		t.Fatal("no store reader for a village-ipam LAN pool")
	}
	got, err := held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[netip.MustParseAddr("10.70.1.5")]) != 1 || got[netip.MustParseAddr("10.70.1.5")][0] != netip.MustParseAddr("192.168.50.210") {
		t.Fatalf("held %v, want only 10.70.1.5 -> 192.168.50.210", got)
	}
	// A DHCP pool has no store: the plugin's reports count alone.
	dhcp := strings.Replace(conf, `"macvlan":{"master":"eth0","pods":"annotated","ipam":{"type":"village-ipam","dataDir":"`+lanDir+`",`+
		`"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.250"}]]}}`,
		`"macvlan":{"master":"eth0","pods":"annotated","ipam":{"type":"dhcp"}}`, 1)
	if dhcp == conf {
		t.Fatal("the DHCP variant did not replace the LAN section")
	}
	d, err := Load(Options{ConfFile: write(t, "10-dhcp.conflist", dhcp), NodeName: "n1", RunDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if d.lanHeld(t.TempDir()) != nil {
		t.Fatal("a store reader for a DHCP pool")
	}
}
