package e2e

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// Two nodes each behind its own NAT, through a hub, with either registry:
// node1 on the LAN carries the Node label village.cni.io/wireguard-hub:
// "true" (kubernetes) or is named in backend.wireguard.hubs (etcd); node2 sits
// behind home1's router and node3 behind home2's (newNATRouter), each
// publishing its home address, which the other cannot reach. node1 has no
// pod: nothing but its agent turns its forwarding on.
//
//   - A pod on node2 pings a pod on node3 through node1: node2's device
//     carries node3's pod subnet on node1's entry, node3's entry keeps
//     its endpoint and keepalive with no subnet, and the same the other
//     way round. node1's underlay carries WireGuard UDP from both homes,
//     the relayed pings among it, and no underlay (node1's, node2's,
//     node3's) carries a pod address or the pings' payload in the clear.
//     villaged status on node2 finds no drift.
//   - The two home routers are then linked (a site-to-site link, routed
//     and not masqueraded): node2 and node3 handshake directly, each moves
//     the other's subnet back to its own entry, the pings cross the link
//     encrypted, and node1 carries none of them; node2's and node3's
//     underlays hold no pod packet in the clear through the move.
func TestAgentWireGuardHub(t *testing.T) {
	t.Run("kubernetes", func(t *testing.T) {
		keyDir := t.TempDir()
		lab := newKubeLabOf(t, "wireguard", 1, func(conf string, _ *kubetest.Server) string { return hubConf(conf, keyDir, "") })
		r1, r2 := hubHomes(lab.agentLab)
		subnets := lab.startWireGuard(keyDir, func() { lab.label(lab.nodes[0].name, kubenames.LabelWireGuardHub, "true") })
		wireGuardHub(t, lab.agentLab, r1, r2, subnets)
	})
	// The etcd registry has no labels: the config names the hub.
	t.Run("etcd", func(t *testing.T) {
		keyDir := t.TempDir()
		lab := newEtcdLabOf(t, 1, func(dataDir string) string {
			return hubConf(agentConflist("wireguard", dataDir), keyDir, `"hubs":["node1"],`)
		})
		r1, r2 := hubHomes(lab)
		wireGuardNodes(lab, keyDir)
		wireGuardHub(t, lab, r1, r2, lab.startAll())
	})
}

// hubConf is a lab conflist under backend wireguard with the key file in
// keyDir, persistentKeepalive natKeepalive and extra ("" or keys ending
// in a comma) in the wireguard section.
func hubConf(conf, keyDir, extra string) string {
	return strings.Replace(conf, `"vni":9,`, fmt.Sprintf(`"wireguard":{%s"keyFile":%q,"persistentKeepalive":%d},`,
		extra, filepath.Join(keyDir, "agt.key"), natKeepalive/time.Second), 1)
}

// hubHomes gives lab (its one node, node1, the hub, on the LAN; a pass
// every second) the two homes with a node each: node2 behind home1's
// router, node3 behind home2's.
func hubHomes(lab *agentLab) (r1, r2 *natRouter) {
	t := lab.t
	lab.period = "1s"
	r1, r2 = newNATRouter(t, lab, home1), newNATRouter(t, lab, home2)
	r1.siteNode(t, lab)
	r2.siteNode(t, lab)
	return r1, r2
}

// wireGuardHub is TestAgentWireGuardHub on lab, its agents started, with
// the pod subnets of its nodes in subnets.
func wireGuardHub(t *testing.T, lab *agentLab, r1, r2 *natRouter, subnets []string) {
	hub, a, b := lab.nodes[0], lab.nodes[1], lab.nodes[2]
	pa, pb := a.NewPod(), b.NewPod()
	a.MustAdd(lab.list, pa)
	b.MustAdd(lab.list, pb)
	toA, toB := podIPv4(t, pa), podIPv4(t, pb)

	// Through the hub.
	underlays := []*testenv.Pcap{testenv.StartPcap(t, hub.NS, "lan0"), testenv.StartPcap(t, a.NS, "lan0"), testenv.StartPcap(t, b.NS, "lan0")}
	took := waitFor(t, 90*time.Second, "pod on node2 -> pod on node3, both behind NAT", func() (bool, string) {
		err := testenv.Ping(pa.NS, toB, 1)
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("node2 -> node3 through the hub after %v (RelayGrace 15 s)", took.Round(time.Millisecond))
	for _, c := range []struct{ self, peer *agentNode }{{a, b}, {b, a}} {
		if ok, why := carries(t, c.self, hub, c.peer, subnetOf(subnets, lab.nodes, c.peer)); !ok {
			t.Fatalf("%s relays %s through the hub: %s", c.self.name, c.peer.name, why)
		}
	}
	// villaged status, reading the device from another process, finds the
	// relayed peer where the agent put it: no drift.
	waitFor(t, 30*time.Second, "villaged status on node2 is clean while it relays", func() (bool, string) {
		out, err := a.villaged(t, "status", "--conf", lab.conf, "--node-name", a.name, "--run-dir", a.runDir).CombinedOutput()
		return err == nil && strings.Contains(string(out), "status: in sync"), string(out)
	})
	relayed := pingBoth(t, pa, pb, toA, toB)
	for i, p := range underlays {
		raw, lines := p.Stop()
		noCleartext(t, lab.nodes[i].name+"'s underlay", raw, lines)
		if i > 0 {
			continue
		}
		for _, site := range []natSite{home1, home2} {
			from := regexp.MustCompile(fmt.Sprintf(`IP %s\.\d+ > %s\.51820: UDP`, regexp.QuoteMeta(site.public()), regexp.QuoteMeta(hub.ip)))
			if !from.MatchString(strings.Join(lines, "\n")) {
				t.Errorf("the hub's underlay has no WireGuard from %s:\n%s", site.public(), strings.Join(lines, "\n"))
			}
		}
		// Each ping and its answer in and out of the hub: 8 packets a
		// ping pair; half of them is proof enough.
		if n := pingPackets(lines); n < 4*relayed {
			t.Errorf("the hub's underlay carried %d WireGuard packets of a ping's size, want %d pings relayed in and out both ways", n, relayed)
		}
	}

	// A direct path: the homes linked, and the routers' flows to the other
	// home's node forgotten (node2's and node3's failed tries to each
	// other would keep their NAT).
	testenv.MustIP(t, r1.ns, "link", "add", "s2s", "type", "veth", "peer", "name", "s2s", "netns", filepath.Base(r2.ns.Path()))
	for _, c := range []struct {
		r         *natRouter
		addr, via string
		other     natSite
	}{{r1, "10.77.0.1/30", "10.77.0.2", home2}, {r2, "10.77.0.2/30", "10.77.0.1", home1}} {
		testenv.MustIP(t, c.r.ns, "addr", "add", c.addr, "dev", "s2s")
		testenv.MustIP(t, c.r.ns, "link", "set", "s2s", "up")
		testenv.MustIP(t, c.r.ns, "route", "add", c.other.prefix+"0/24", "via", c.via)
	}
	// Through the move: captures on both homes' nodes and 10 s of pings.
	homes := []*testenv.Pcap{testenv.StartPcap(t, a.NS, "lan0"), testenv.StartPcap(t, b.NS, "lan0")}
	moving := pingEvery(pa.NS, toB, 100)
	r1.forget(t, b.ip)
	r2.forget(t, a.ip)
	took = waitFor(t, 60*time.Second, "node2 and node3 reach each other directly", func() (bool, string) {
		var why []string
		for _, c := range []struct{ self, peer *agentNode }{{a, b}, {b, a}} {
			if ok, w := carries(t, c.self, c.peer, c.peer, subnetOf(subnets, lab.nodes, c.peer)); !ok {
				why = append(why, w)
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
	t.Logf("direct path used %v after the homes were linked", took.Round(time.Millisecond))
	link, atHub := testenv.StartPcap(t, r1.ns, "s2s"), testenv.StartPcap(t, hub.NS, "lan0")
	direct := pingBoth(t, pa, pb, toA, toB)
	raw, lines := link.Stop()
	noCleartext(t, "the homes' link", raw, lines)
	if n := pingPackets(lines); n < 2*direct {
		t.Errorf("the homes' link carried %d WireGuard packets of a ping's size, want %d pings both ways:\n%s", n, direct, strings.Join(lines, "\n"))
	}
	r := <-moving
	t.Logf("pings every 100 ms through the move to the direct path: %d of %d answered", r.got, r.sent)
	for i, p := range homes {
		raw, lines := p.Stop()
		noCleartext(t, []string{"node2", "node3"}[i]+"'s underlay through the move to the direct path", raw, lines)
	}
	raw, lines = atHub.Stop()
	noCleartext(t, "node1's underlay", raw, lines)
	if n := pingPackets(lines); n != 0 {
		t.Errorf("the hub still carried %d WireGuard packets of a ping's size on the direct path:\n%s", n, strings.Join(lines, "\n"))
	}
}

// carries tells whether self's device has peer's subnet on via's entry
// (via is peer: directly) and, when via is another node, peer's entry
// with its endpoint and keepalive but no subnet.
func carries(t *testing.T, self, via, peer *agentNode, subnet string) (bool, string) {
	d := wgDevice(t, self)
	byKey := map[string]wgtypes.Peer{}
	for _, p := range d.Peers {
		byKey[p.PublicKey.String()] = p
	}
	has := func(p wgtypes.Peer) bool {
		for _, n := range p.AllowedIPs {
			if n.String() == subnet {
				return true
			}
		}
		return false
	}
	v, ok := byKey[wgKey(t, via)]
	if !ok || !has(v) {
		return false, fmt.Sprintf("%s: %s not on %s's entry %v", self.name, subnet, via.name, v.AllowedIPs)
	}
	if via == peer {
		return true, ""
	}
	p, ok := byKey[wgKey(t, peer)]
	if !ok || len(p.AllowedIPs) != 0 || p.Endpoint == nil || p.PersistentKeepaliveInterval != natKeepalive {
		return false, fmt.Sprintf("%s: %s's entry %+v (want endpoint, keepalive %v, no subnet)", self.name, peer.name, p, natKeepalive)
	}
	return true, ""
}

// subnetOf is node n's pod subnet (subnets follow nodes' order).
func subnetOf(subnets []string, nodes []*agentNode, n *agentNode) string {
	for i, m := range nodes {
		if m == n {
			return subnets[i]
		}
	}
	return ""
}

// pingBoth pings (pingEvery: its payload pingSecret, 100 ms apart) from pa
// to toB and from pb to toA, 20 each at once, fails unless every one is
// answered, and returns how many each side sent.
func pingBoth(t *testing.T, pa, pb *Pod, toA, toB string) int {
	const count = 20
	ab, ba := pingEvery(pa.NS, toB, count), pingEvery(pb.NS, toA, count)
	for _, r := range []pingResult{<-ab, <-ba} {
		if r.sent != count || r.got != count {
			t.Fatalf("pings across: %d sent, %d answered:\n%s", r.sent, r.got, r.out)
		}
	}
	return count
}

// wgPingSize is tcpdump's UDP length of WireGuard carrying one of ping's
// default packets: 84 bytes, padded to 96, plus WireGuard's 16-byte header
// and 16-byte tag; no WireGuard control message has it (keepalive 32,
// handshake 148 and 92, cookie 64).
var wgPingSize = regexp.MustCompile(` UDP, length 128$`)

// pingPackets counts the WireGuard packets of a ping's size in lines.
func pingPackets(lines []string) int {
	n := 0
	for _, l := range lines {
		if wgPingSize.MatchString(l) {
			n++
		}
	}
	return n
}

// noCleartext fails t when a capture has a pod address (10.70.0.0/16) in
// a header or pingSecret in its bytes: a pod packet in the clear.
func noCleartext(t *testing.T, what string, raw []byte, lines []string) {
	t.Helper()
	_, pods, _ := net.ParseCIDR("10.70.0.0/16")
	addr := regexp.MustCompile(`\d+\.\d+\.\d+\.\d+`)
	for _, l := range lines {
		for _, s := range addr.FindAllString(l, -1) {
			if ip := net.ParseIP(s); ip != nil && pods.Contains(ip) {
				t.Errorf("%s carried a pod packet in the clear: %s", what, l)
			}
		}
	}
	if bytes.Contains(raw, []byte(pingSecret)) {
		t.Errorf("%s carried the pings' payload in the clear", what)
	}
}
