package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/netsetup"
)

// macOf reads a link's MAC in node n.
func macOf(t *testing.T, n *Node, dev string) string {
	t.Helper()
	var links []struct {
		Address string `json:"address"`
	}
	out := testenv.MustIP(t, n.NS, "-j", "link", "show", "dev", dev)
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -j link show dev %s: %v: %s", dev, err, out)
	}
	return links[0].Address
}

// TestMACsStayPut: the host veth and the host shim get MACs of Village's
// choosing at creation, and a MAC changed behind Village's back (as udev's
// MACAddressPolicy=persistent does) is put back by the next ADD and by
// villaged; a bridge that existed before Village (taking its lowest port's
// MAC) keeps its MAC when that port goes.
func TestMACsStayPut(t *testing.T) {
	lan := NewLAN(t)
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	// cni0 as another plugin left it: no MAC of its own, one port with a low MAC.
	testenv.MustIP(t, n.NS, "link", "add", "cni0", "type", "bridge")
	testenv.MustIP(t, n.NS, "link", "add", "old0", "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", "old0p")
	testenv.MustIP(t, n.NS, "link", "set", "old0", "master", "cni0", "up")
	testenv.MustIP(t, n.NS, "link", "set", "cni0", "up")
	if m := macOf(t, n, "cni0"); m != "02:00:00:00:00:01" {
		t.Fatalf("the bridge does not follow its port: %s", m)
	}
	text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"macs","plugins":[{"type":"village","bridge":"cni0","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.54.1.0/24"}]]},
		"backend":{"type":"none","underlay":"lan0"},
		"macvlan":{"master":"lan0","mode":"bridge","ifName":"net1","hostShim":true,
			"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"192.168.77.0/24","rangeStart":"192.168.77.200","rangeEnd":"192.168.77.203"}]]}}}]}`,
		filepath.Join(n.Dir, "pods"), filepath.Join(n.Dir, "lan"))
	conf := filepath.Join(n.Dir, "macs.conflist")
	must(t, os.WriteFile(conf, []byte(text), 0o644), "writing the conflist")
	l := ConfList(t, text)
	p := n.NewPod()
	r := n.MustAdd(l, p)
	veth := r.Interfaces[1].Name
	lanMAC, err := net.ParseMAC(macOf(t, n, "lan0"))
	must(t, err, "lan0 MAC")
	want := map[string]string{
		veth:         netsetup.HostVethMAC(veth).String(),
		"vshim-lan0": macvlan.ShimMAC(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{HardwareAddr: lanMAC}}).String(),
	}
	check := func(what string) (bool, string) {
		got := ""
		ok := true
		for dev, mac := range want {
			m := macOf(t, n, dev)
			got += dev + " " + m + "; "
			ok = ok && m == mac
		}
		return ok, got
	}
	if ok, got := check("after ADD"); !ok || r.Interfaces[1].Mac != want[veth] {
		t.Fatalf("MACs after ADD: %s (result %s), want %v", got, r.Interfaces[1].Mac, want)
	}

	bridgeMAC := macOf(t, n, "cni0")
	testenv.MustIP(t, n.NS, "link", "del", "old0")
	if m := macOf(t, n, "cni0"); m != bridgeMAC {
		t.Fatalf("the reused bridge changed its MAC from %s to %s when its other port went", bridgeMAC, m)
	}
	must(t, testenv.Ping(n.NS, r.IPs[0].Address.IP.String(), 2), "node -> pod through the bridge")

	scramble := func() {
		testenv.MustIP(t, n.NS, "link", "set", veth, "address", "02:11:22:33:44:55")
		testenv.MustIP(t, n.NS, "link", "set", "vshim-lan0", "address", "02:11:22:33:44:66")
		if ok, got := check("scrambled"); ok {
			t.Fatalf("MACs did not change by hand: %s", got)
		}
	}
	scramble()
	n.MustAdd(l, p)
	if ok, got := check("after the repeated ADD"); !ok {
		t.Fatalf("the repeated ADD left %s, want %v", got, want)
	}

	scramble()
	runVillaged(t, n, conf, "node1", "200ms")
	waitFor(t, 20*time.Second, "villaged puts the MACs back", func() (bool, string) { return check("villaged") })
	must(t, n.Del(l, p), "DEL")
}
