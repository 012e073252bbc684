package attack_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/wireguard"
	"github.com/village-cni/village/pkg/wireguard/userspace"
)

// The WireGuard attacks run each WireGuard device in a process of its own
// in its namespace (testenv.StartChild: wireguard-go opens its sockets from
// its own threads), configured through pkg/wireguard as the agent's
// reconciler configures it: Ensure, SetPeers, and SetPrivateKey for a
// rotation (test/e2e TestAgentWireGuardKeys drives the same through
// villaged).
func TestMain(m *testing.M) {
	if testenv.IsChild() {
		wgChild()
		return
	}
	os.Exit(m.Run())
}

// wgCmd is one command to a WireGuard child: up (Key, the private key),
// peers, key (a new private key), show.
type wgCmd struct {
	Op    string
	Key   string   `json:",omitempty"`
	Peers []wgPeer `json:",omitempty"`
}

type wgPeer struct {
	Key       string
	Endpoint  string   `json:",omitempty"`
	Allowed   []string `json:",omitempty"`
	Handshake bool     `json:",omitempty"` // show: a handshake completed
}

type wgReply struct {
	Err   string   `json:",omitempty"`
	Peers []wgPeer `json:",omitempty"`
}

var wgDev = overlay.WireGuardDeviceName(overlay.DefaultWireGuardPort)

func wgChild() {
	var dev *wireguard.Device
	testenv.ServeChild(func(line []byte) (any, bool) {
		var c wgCmd
		var r wgReply
		err := json.Unmarshal(line, &c)
		if err == nil {
			r.Peers, err = wgDo(&dev, c)
		}
		if err != nil {
			r.Err = err.Error()
		}
		return r, false
	})
	if dev != nil {
		_ = dev.Close()
	}
}

func wgDo(dev **wireguard.Device, c wgCmd) ([]wgPeer, error) {
	if c.Op != "up" && *dev == nil {
		return nil, errors.New("no device")
	}
	switch c.Op {
	case "up":
		if err := testenv.PrivateWireGuardRun(); err != nil {
			return nil, err
		}
		k, err := wgtypes.ParseKey(c.Key)
		if err != nil {
			return nil, err
		}
		*dev, err = wireguard.Ensure(wireguard.DeviceConfig{Name: wgDev, PrivateKey: k, ListenPort: overlay.DefaultWireGuardPort,
			Userspace: wireguard.UserspaceAlways, Start: userspace.Start})
		return nil, err
	case "key":
		k, err := wgtypes.ParseKey(c.Key)
		if err != nil {
			return nil, err
		}
		return nil, (*dev).SetPrivateKey(k)
	case "peers":
		var peers []wireguard.Peer
		for _, p := range c.Peers {
			k, err := wgtypes.ParseKey(p.Key)
			if err != nil {
				return nil, err
			}
			peer := wireguard.Peer{PublicKey: k, PersistentKeepalive: 25 * time.Second}
			if peer.Endpoint, err = net.ResolveUDPAddr("udp", p.Endpoint); err != nil {
				return nil, err
			}
			for _, a := range p.Allowed {
				_, n, err := net.ParseCIDR(a)
				if err != nil {
					return nil, err
				}
				peer.AllowedIPs = append(peer.AllowedIPs, *n)
			}
			peers = append(peers, peer)
		}
		_, err := (*dev).SetPeers(peers)
		return nil, err
	case "show":
		ps, err := (*dev).Peers()
		var out []wgPeer
		for _, p := range ps {
			out = append(out, wgPeer{Key: p.PublicKey.String(), Handshake: !p.LastHandshakeTime.IsZero()})
		}
		return out, err
	}
	return nil, fmt.Errorf("unknown op %q", c.Op)
}

// wgHost is a namespace on the LAN running a WireGuard device.
type wgHost struct {
	t    *testing.T
	name string
	ns   ns.NetNS
	ip   string // on the LAN
	c    *testenv.Child
	key  wgtypes.Key
}

func (h *wgHost) do(c wgCmd) []wgPeer {
	h.t.Helper()
	var r wgReply
	h.c.Do(c, &r)
	if r.Err != "" {
		h.t.Fatalf("%s: %s: %s", h.name, c.Op, r.Err)
	}
	return r.Peers
}

// up gives h a device with private key k, through which it routes routes.
func (h *wgHost) up(k wgtypes.Key, addr string, routes ...string) {
	h.t.Helper()
	h.key = k
	h.do(wgCmd{Op: "up", Key: k.String()})
	if addr != "" {
		testenv.MustIP(h.t, h.ns, "addr", "add", addr, "dev", wgDev)
	}
	for _, r := range routes {
		testenv.MustIP(h.t, h.ns, "route", "replace", r, "dev", wgDev)
	}
}

// peer is h as a peer of the others: its public key at its LAN address.
func (h *wgHost) peer(allowed ...string) wgPeer {
	return wgPeer{Key: h.key.PublicKey().String(), Endpoint: fmt.Sprintf("%s:%d", h.ip, overlay.DefaultWireGuardPort), Allowed: allowed}
}

func newKey(t *testing.T) wgtypes.Key {
	k, err := wgtypes.GeneratePrivateKey()
	must(t, err, "a WireGuard key")
	return k
}

// wgLab is two nodes, each with a pod routed through its WireGuard device
// to the other's (pods 10.70.1.2 and 10.70.2.2), and a host on the LAN
// that is not a node.
type wgLab struct {
	t         *testing.T
	lan       *testenv.LAN
	n1, n2, x *wgHost
	pod1      ns.NetNS
	pod2      ns.NetNS
}

func newWGLab(t *testing.T) *wgLab {
	l := &wgLab{t: t, lan: testenv.NewLAN(t)}
	host := func(name, ip string) *wgHost {
		h := l.lan.Host("lan0", ip+"/24")
		return &wgHost{t: t, name: name, ns: h.NS, ip: ip, c: testenv.StartChild(t, h.NS)}
	}
	l.n1, l.n2, l.x = host("node1", "192.168.90.11"), host("node2", "192.168.90.12"), host("LAN host", "192.168.90.66")
	pod := func(n *wgHost, i int) ns.NetNS {
		p := testenv.NewNS(t)
		testenv.MustIP(t, n.ns, "link", "add", "vpod", "type", "veth", "peer", "name", "eth0", "netns", filepath.Base(p.Path()))
		testenv.MustIP(t, n.ns, "addr", "add", fmt.Sprintf("10.70.%d.1/24", i), "dev", "vpod")
		testenv.MustIP(t, n.ns, "link", "set", "vpod", "up")
		testenv.MustIP(t, p, "addr", "add", fmt.Sprintf("10.70.%d.2/24", i), "dev", "eth0")
		testenv.MustIP(t, p, "link", "set", "eth0", "up")
		testenv.MustIP(t, p, "route", "add", "default", "via", fmt.Sprintf("10.70.%d.1", i))
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.ns.Path()), "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput()
		must(t, err, "forwarding in %s: %s", n.name, out)
		return p
	}
	l.pod1, l.pod2 = pod(l.n1, 1), pod(l.n2, 2)
	l.n1.up(newKey(t), "", "10.70.2.0/24")
	l.n2.up(newKey(t), "", "10.70.1.0/24")
	l.n1.do(wgCmd{Op: "peers", Peers: []wgPeer{l.n2.peer("10.70.2.0/24")}})
	l.n2.do(wgCmd{Op: "peers", Peers: []wgPeer{l.n1.peer("10.70.1.0/24")}})
	l.podsTalk("at start")
	return l
}

// podsTalk fails the test unless the pods reach each other (the tunnel
// works in the same run as the attack).
func (l *wgLab) podsTalk(when string) {
	l.t.Helper()
	testenv.WaitFor(l.t, "pod on node2 -> pod on node1 "+when, func() error { return testenv.Ping(l.pod2, "10.70.1.2", 1) })
	must(l.t, testenv.Ping(l.pod1, "10.70.2.2", 2), "pod on node1 -> pod on node2 %s", when)
}

// sent fails the test unless the capture of a node's underlay holds the
// attacker's UDP to the WireGuard port (the attack reached the node), and
// returns how many such packets it holds.
func sent(t *testing.T, lines []string, from, node string) int {
	t.Helper()
	want := fmt.Sprintf("IP %s.%d > %s.%d: UDP", from, overlay.DefaultWireGuardPort, node, overlay.DefaultWireGuardPort)
	n := 0
	for _, l := range lines {
		if strings.Contains(l, want) {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the attacker's WireGuard packets never reached %s (%d lines captured): the attack did not run", node, len(lines))
	}
	return n
}

// inPod is the lines of a pod's capture that come from src.
func inPod(lines []string, src string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, "IP "+src+" ") {
			out = append(out, l)
		}
	}
	return out
}

// A host on the LAN that is not a node runs its own WireGuard device with
// a key it made up, configured with node1's public key and endpoint, and
// sends to node1's pod from an address of node2's pod subnet (ping and
// UDP, through its tunnel), and junk datagrams straight at the port: node1 never completes a handshake with an
// unknown key, so nothing reaches the pod (a capture in the pod holds none
// of it) and nothing answers; node1's underlay shows the attempts
// arrived, and the pods of the two nodes talk in the same run.
func TestWireGuardMadeUpKey(t *testing.T) {
	l := newWGLab(t)
	// The captures first: the device sends its first handshake when its
	// peer is set (the keepalive), and the next only five seconds later.
	underlay := testenv.StartPcap(t, l.n1.ns, "lan0")
	inside := testenv.StartPcap(t, l.pod1, "eth0")
	l.x.up(newKey(t), "10.70.2.99/32", "10.70.1.0/24")
	l.x.do(wgCmd{Op: "peers", Peers: []wgPeer{l.n1.peer("10.70.0.0/16")}})
	// 30 pings over six seconds: the device tries a second handshake.
	if err := testenv.Ping(l.x.ns, "10.70.1.2", 30); err == nil {
		t.Errorf("the LAN host's ping with a made-up key was answered by node1's pod")
	}
	_ = testenv.SendUDP(l.x.ns, "10.70.1.2", 9, 20)
	// And junk straight at the port, outside any tunnel.
	_ = testenv.SendUDP(l.x.ns, l.n1.ip, overlay.DefaultWireGuardPort, 50)
	l.podsTalk("during the attack")
	_, pod := inside.Stop()
	_, lines := underlay.Stop()
	n := sent(t, lines, l.x.ip, l.n1.ip)
	if got := inPod(pod, "10.70.2.99"); len(got) > 0 {
		t.Errorf("packets of the made-up key reached the pod:\n%s", strings.Join(got, "\n"))
	}
	for _, p := range l.x.do(wgCmd{Op: "show"}) {
		if p.Handshake {
			t.Errorf("node1 completed a handshake with the made-up key")
		}
	}
	t.Logf("%d WireGuard packets of the LAN host reached node1's port; none of its traffic reached the pod", n)
}

// node1's private key is stolen, then node1 rotates it (the device takes
// a new key, node2 replaces node1's peer entry: what `villaged rotate-key`
// does, through the registry). Before the rotation the thief, on another
// host of the LAN, passes for node1 and reaches node2's pod (the check
// detects the attack); after it, traffic sealed with the old key reaches
// nothing: node2 has no peer with that key, a capture in its pod holds none
// of the thief's packets, and node1's pods reach node2's with the new key.
func TestWireGuardStolenKeyAfterRotation(t *testing.T) {
	l := newWGLab(t)
	stolen := l.n1.key
	l.x.up(stolen, "10.70.1.99/32", "10.70.2.0/24")
	l.x.do(wgCmd{Op: "peers", Peers: []wgPeer{l.n2.peer("10.70.2.0/24")}})

	inside := testenv.StartPcap(t, l.pod2, "eth0")
	testenv.WaitFor(t, "the thief reaches node2's pod with the stolen key before the rotation", func() error {
		return testenv.Ping(l.x.ns, "10.70.2.2", 1)
	})
	_, pod := inside.Stop()
	if len(inPod(pod, "10.70.1.99")) == 0 {
		t.Fatalf("the thief's ping was answered but the pod's capture holds none of it")
	}

	// The rotation, as the agents do it.
	fresh := newKey(t)
	l.n1.do(wgCmd{Op: "key", Key: fresh.String()})
	l.n1.key = fresh
	l.n2.do(wgCmd{Op: "peers", Peers: []wgPeer{l.n1.peer("10.70.1.0/24")}})
	l.podsTalk("after the rotation")
	for _, p := range l.n2.do(wgCmd{Op: "show"}) {
		if p.Key == stolen.PublicKey().String() {
			t.Fatalf("node2 still has a peer with node1's old key")
		}
	}

	underlay := testenv.StartPcap(t, l.n2.ns, "lan0")
	inside = testenv.StartPcap(t, l.pod2, "eth0")
	if err := testenv.Ping(l.x.ns, "10.70.2.2", 3); err == nil {
		t.Errorf("the thief's ping with the old key was answered after the rotation")
	}
	_ = testenv.SendUDP(l.x.ns, "10.70.2.2", 9, 20)
	// The thief's session from before the rotation is gone too: a new
	// handshake with the old key is what it tries now.
	l.x.do(wgCmd{Op: "peers", Peers: nil})
	l.x.do(wgCmd{Op: "peers", Peers: []wgPeer{l.n2.peer("10.70.2.0/24")}})
	if err := testenv.Ping(l.x.ns, "10.70.2.2", 3); err == nil {
		t.Errorf("the thief's ping with a new handshake under the old key was answered after the rotation")
	}
	l.podsTalk("after the attack")
	_, pod = inside.Stop()
	_, lines := underlay.Stop()
	n := sent(t, lines, l.x.ip, l.n2.ip)
	if got := inPod(pod, "10.70.1.99"); len(got) > 0 {
		t.Errorf("packets sealed with the old key reached the pod after the rotation:\n%s", strings.Join(got, "\n"))
	}
	t.Logf("after the rotation %d WireGuard packets of the thief reached node2's port; none of its traffic reached the pod", n)
}
