package wireguard

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/testenv"
)

// devName is a device name no other test process on this machine uses: the
// UAPI socket directory is shared by all namespaces.
func devName(suffix string) string { return fmt.Sprintf("wgt%d%s", os.Getpid()%100000, suffix) }

func nsName(n ns.NetNS) string { return filepath.Base(n.Path()) }

func inNS(t testing.TB, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", nsName(n)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), nsName(n), err, out)
	}
	return string(out)
}

// newTunnel makes two nodes joined by a veth (the underlay, ul0:
// 192.168.90.1 and .2), each running a userspace device that routes the
// other's "pod" subnet (10.244.1.0/24, 10.244.2.0/24; the pod addresses .1
// sit on the devices themselves).
func newTunnel(t testing.TB) (a, b ns.NetNS) {
	t.Helper()
	tn := newTunnelNodes(t)
	tn.na.must(tn.peersOfA())
	tn.nb.must(tn.peersOfB())
	return tn.a, tn.b
}

// tunnelNodes are newTunnel's two nodes before they know each other.
type tunnelNodes struct {
	a, b   ns.NetNS
	na, nb *node
	ra, rb nodeReply // their ensure replies (public keys)
}

func (tn tunnelNodes) peersOfA() nodeCmd {
	return nodeCmd{Op: "peers", Peers: []nodePeer{{Key: tn.rb.Public, Endpoint: "192.168.90.2:51820", Allowed: []string{"10.244.2.0/24"}, Keepalive: 25 * time.Second}}}
}

func (tn tunnelNodes) peersOfB() nodeCmd {
	return nodeCmd{Op: "peers", Peers: []nodePeer{{Key: tn.ra.Public, Endpoint: "192.168.90.1:51820", Allowed: []string{"10.244.1.0/24"}, Keepalive: 25 * time.Second}}}
}

func newTunnelNodes(t testing.TB) tunnelNodes {
	t.Helper()
	a, b := testenv.NewNS(t), testenv.NewNS(t)
	testenv.MustIP(t, a, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", nsName(b))
	under := map[ns.NetNS]string{a: "192.168.90.1", b: "192.168.90.2"}
	for n, ip := range under {
		// No IPv6 on the underlay: its neighbour discovery would be the
		// only other traffic on it.
		inNS(t, n, "sysctl", "-qw", "net.ipv6.conf.ul0.disable_ipv6=1")
		testenv.MustIP(t, n, "addr", "add", ip+"/24", "dev", "ul0")
		testenv.MustIP(t, n, "link", "set", "ul0", "up")
	}
	keys := t.TempDir()
	na, nb := startNode(t, a), startNode(t, b)
	wa, wb := devName("a"), devName("b")
	ra := na.must(nodeCmd{Op: "ensure", Name: wa, KeyFile: keys + "/a.key", Port: 51820, MTU: 1420, Userspace: UserspaceAlways})
	rb := nb.must(nodeCmd{Op: "ensure", Name: wb, KeyFile: keys + "/b.key", Port: 51820, MTU: 1420, Userspace: UserspaceAlways})
	if !ra.Userspace || !rb.Userspace {
		t.Fatalf("userspace policy always made a kernel device: %+v %+v", ra, rb)
	}
	testenv.MustIP(t, a, "addr", "add", "10.244.1.1/32", "dev", wa)
	testenv.MustIP(t, a, "route", "add", "10.244.2.0/24", "dev", wa, "src", "10.244.1.1")
	testenv.MustIP(t, b, "addr", "add", "10.244.2.1/32", "dev", wb)
	testenv.MustIP(t, b, "route", "add", "10.244.1.0/24", "dev", wb, "src", "10.244.2.1")
	return tunnelNodes{a: a, b: b, na: na, nb: nb, ra: ra, rb: rb}
}

// Two nodes joined by a veth (the underlay) each run a userspace device;
// each routes the other's pod subnet through its device. Pings and a TCP
// answer cross, and a capture on the underlay holds nothing but UDP
// between the two WireGuard ports, without the plaintext.
func TestTunnelEncrypts(t *testing.T) {
	a, b := newTunnel(t)
	canary := "village-wireguard-plaintext-canary-" + fmt.Sprint(time.Now().UnixNano())
	testenv.ServeTCP(t, b, "10.244.2.1:7777", canary)
	capt := testenv.StartPcap(t, a, "ul0")
	took := testenv.WaitFor(t, "ping through the tunnel", func() error { return testenv.Ping(a, "10.244.2.1", 1) })
	t.Logf("first ping answered after %v (handshake included)", took)
	c, err := testenv.DialerIn(a)("10.244.2.1:7777", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(got) != canary {
		t.Fatalf("TCP through the tunnel read %q (%v), want %q", got, err, canary)
	}
	raw, lines := capt.Stop()

	udp := regexp.MustCompile(`^\S+ IP 192\.168\.90\.[12]\.51820 > 192\.168\.90\.[12]\.51820: UDP, length \d+$`)
	n := testenv.OnlyCarried(t, raw, lines, udp, testenv.UnderlayChatter, canary)
	t.Logf("underlay: %d WireGuard UDP packets, no plaintext", n)

	// The check can see plaintext: the same canary sent in clear over the
	// underlay is in the capture.
	ctl := testenv.StartPcap(t, a, "ul0")
	if err := testenv.InNS(a, func() error {
		u, err := net.Dial("udp", "192.168.90.2:9")
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte(canary))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if raw, _ := ctl.Stop(); !bytes.Contains(raw, []byte(canary)) {
		t.Fatalf("control: plaintext sent on the underlay is not in the capture")
	}

	out := inNS(t, a, "ping", "-q", "-c", "20", "-i", "0.05", "10.244.2.1")
	if m := regexp.MustCompile(`= [\d.]+/([\d.]+)/`).FindStringSubmatch(out); m != nil {
		t.Logf("ping RTT through userspace WireGuard: avg %s ms", m[1])
	}
}

// Ensure is idempotent and changes only what differs; SetPeers makes the
// given list the whole peer list, touches nothing when it already is, and a
// node's new key replaces its old peer.
func TestEnsureAndSetPeers(t *testing.T) {
	n := testenv.NewNS(t)
	nd := startNode(t, n)
	// Peers written as asked: none is added quietly (TestLowerKeySpeaksFirst).
	nd.must(nodeCmd{Op: "quiet", Quiet: 0})
	name := devName("p")
	key := t.TempDir() + "/k.key"
	r1 := nd.must(nodeCmd{Op: "ensure", Name: name, KeyFile: key, Port: 51820, MTU: 1420, Userspace: UserspaceAlways})
	r2 := nd.must(nodeCmd{Op: "ensure", Name: name, KeyFile: key, Port: 51820, MTU: 1420, Userspace: UserspaceAlways})
	if r1.Index != r2.Index || r1.Public != r2.Public {
		t.Fatalf("second Ensure made another device or key: %+v then %+v", r1, r2)
	}
	r3 := nd.must(nodeCmd{Op: "ensure", Name: name, KeyFile: key, Port: 51821, MTU: 1380, Userspace: UserspaceAlways})
	if r3.Index != r1.Index {
		t.Fatalf("changing port and MTU remade the device: index %d then %d", r1.Index, r3.Index)
	}
	if out := testenv.MustIP(t, n, "link", "show", name); !strings.Contains(out, " mtu 1380 ") || !strings.Contains(out, ",UP") {
		t.Fatalf("device not up with MTU 1380: %s", out)
	}
	wc, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	show := func() *wgtypes.Device {
		t.Helper()
		d, err := wc.Device(name) // through the UAPI socket the node serves
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := show(); d.ListenPort != 51821 || d.PublicKey.String() != r1.Public || d.Type != wgtypes.Userspace {
		t.Fatalf("device %s: port %d key %s type %v, want 51821 %s userspace", name, d.ListenPort, d.PublicKey, d.Type, r1.Public)
	}

	k := func() string {
		pk, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		return pk.PublicKey().String()
	}
	p1, p2, p3 := k(), k(), k()
	// The endpoints are documentation addresses: this namespace has no
	// route to them, so nothing is sent.
	set := func(want int, peers ...nodePeer) {
		t.Helper()
		if r := nd.must(nodeCmd{Op: "peers", Peers: peers}); r.Changed != want {
			t.Errorf("SetPeers changed %d peers, want %d", r.Changed, want)
		}
		var got, exp []string
		for _, p := range show().Peers {
			got = append(got, describe(p.PublicKey.String(), p.Endpoint, p.AllowedIPs, p.PersistentKeepaliveInterval))
		}
		for _, p := range peers {
			var ep *net.UDPAddr
			if p.Endpoint != "" {
				ep, _ = net.ResolveUDPAddr("udp", p.Endpoint)
			}
			var nets []net.IPNet
			for _, a := range p.Allowed {
				_, c, _ := net.ParseCIDR(a)
				nets = append(nets, *c)
			}
			exp = append(exp, describe(p.Key, ep, nets, p.Keepalive))
		}
		slices.Sort(got)
		slices.Sort(exp)
		if !slices.Equal(got, exp) {
			t.Fatalf("device peers\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(exp, "\n"))
		}
	}
	one := nodePeer{Key: p1, Endpoint: "192.0.2.1:51820", Allowed: []string{"10.244.1.0/24"}, Keepalive: 25 * time.Second}
	two := nodePeer{Key: p2, Endpoint: "192.0.2.2:51820", Allowed: []string{"10.244.2.0/24", "fd44:2::/64"}}
	set(2, one, two)
	set(0, one, two) // nothing differs: nothing written
	moved := one
	moved.Endpoint = "192.0.2.11:51820"
	rekeyed := two // node two came back with a new key
	rekeyed.Key = p3
	set(3, moved, rekeyed) // p1 changed, p3 added, p2 removed
	if r := nd.do(nodeCmd{Op: "peers", Peers: []nodePeer{moved, moved}}); !strings.Contains(r.Err, "listed twice") {
		t.Fatalf("a key listed twice: err %q", r.Err)
	}
	set(0, moved, rekeyed) // the refused list wrote nothing
	set(2)                 // none left
}

func describe(key string, ep *net.UDPAddr, allowed []net.IPNet, ka time.Duration) string {
	return fmt.Sprintf("%s %v %v %v", key, ep, prefixSet(allowed), ka)
}

// The userspace policy: never gives the kernel's device or ErrNoKernel,
// auto gives the kernel's when the kernel can make one and wireguard-go
// otherwise; a name taken by another link (a veth) is ErrInUse; Close removes a
// userspace device and its UAPI socket.
func TestUserspacePolicy(t *testing.T) {
	n := testenv.NewNS(t)
	_, err := testenv.IP(n, "link", "add", "wgprobe", "type", "wireguard")
	kernel := err == nil
	t.Logf("kernel WireGuard here: %v", kernel)
	nd := startNode(t, n)
	key := t.TempDir() + "/k.key"
	never, auto := devName("n"), devName("u")
	r := nd.do(nodeCmd{Op: "ensure", Name: never, KeyFile: key, Port: 51820, Userspace: UserspaceNever})
	if kernel && (r.Err != "" || r.Userspace) || !kernel && !r.NoKernel {
		t.Fatalf("policy never with kernel WireGuard %v: %+v", kernel, r)
	}
	if _, err := testenv.IP(n, "link", "show", never); kernel != (err == nil) {
		t.Fatalf("policy never: link %s exists %v, want %v", never, err == nil, kernel)
	}
	testenv.MustIP(t, n, "link", "add", "taken0", "type", "veth", "peer", "name", "taken1")
	if r := nd.do(nodeCmd{Op: "ensure", Name: "taken0", KeyFile: key, Port: 51820}); !r.InUse {
		t.Fatalf("a dummy's name: %+v, want ErrInUse", r)
	}
	r = nd.must(nodeCmd{Op: "ensure", Name: auto, KeyFile: key, Port: 51822})
	if r.Userspace == kernel {
		t.Fatalf("policy auto with kernel WireGuard %v made userspace %v", kernel, r.Userspace)
	}
	sock := "/var/run/wireguard/" + auto + ".sock"
	if _, err := os.Stat(sock); r.Userspace && err != nil {
		t.Fatalf("userspace device serves no UAPI socket: %v", err)
	}
	nd.must(nodeCmd{Op: "close"})
	if !kernel {
		if _, err := testenv.IP(n, "link", "show", auto); err == nil {
			t.Fatalf("closed userspace device %s still exists", auto)
		}
		if _, err := os.Stat(sock); err == nil {
			t.Fatalf("closed userspace device left its socket %s", sock)
		}
	}
}

// BenchmarkTunnelTCP is TCP throughput through two wireguard-go devices
// (one process each, on this machine's cores): bytes per op are one
// 1 MiB write, so MB/s is the tunnel's goodput.
func BenchmarkTunnelTCP(b *testing.B) {
	na, nb := newTunnel(b)
	var ln net.Listener
	if err := testenv.InNS(nb, func() (err error) {
		ln, err = net.Listen("tcp", "10.244.2.1:7778")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	testenv.WaitFor(b, "ping through the tunnel", func() error { return testenv.Ping(na, "10.244.2.1", 1) })
	c, err := testenv.DialerIn(na)("10.244.2.1:7778", 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEnsureWithoutUserspace: a process that hands Ensure no Start (the
// CNI plugin) never makes a wireguard-go device: the policy always fails
// with ErrNoUserspace and leaves no interface behind.
func TestEnsureWithoutUserspace(t *testing.T) {
	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	name := devName("n")
	_, err = Ensure(DeviceConfig{Name: name, PrivateKey: key, ListenPort: 51820, Userspace: UserspaceAlways})
	if !errors.Is(err, ErrNoUserspace) {
		t.Fatalf("Ensure with no Start = %v; want ErrNoUserspace", err)
	}
	if _, err := net.InterfaceByName(name); err == nil {
		t.Fatalf("interface %s made anyway", name)
	}
}

// Two nodes that learn of each other at the same moment (both given the
// other with a keepalive at once) must not both initiate: crossed
// initiations can lose both handshakes for WireGuard's 5 s retry. Only the
// lower key's node initiates; the other stays quiet (here for longer than
// the test) and still ends with a session, from answering.
func TestLowerKeySpeaksFirst(t *testing.T) {
	tn := newTunnelNodes(t)
	tn.na.must(nodeCmd{Op: "quiet", Quiet: time.Hour})
	tn.nb.must(nodeCmd{Op: "quiet", Quiet: time.Hour})
	ka, kb := mustKey(t, tn.ra.Public), mustKey(t, tn.rb.Public)
	low, high, lowNode, highNode, lowIP, highIP := tn.ra.Public, tn.rb.Public, tn.na, tn.nb, "192.168.90.1", "192.168.90.2"
	if bytes.Compare(kb[:], ka[:]) < 0 {
		low, high, lowNode, highNode, lowIP, highIP = high, low, highNode, lowNode, highIP, lowIP
	}
	capt := testenv.StartPcap(t, tn.a, "ul0")
	done := make(chan nodeReply, 1)
	go func() { done <- tn.nb.do(tn.peersOfB()) }()
	tn.na.must(tn.peersOfA())
	if r := <-done; r.Err != "" {
		t.Fatalf("node b peers: %s", r.Err)
	}
	testenv.WaitFor(t, "a session on both nodes, with no packet sent through it", func() error {
		for _, n := range []*node{tn.na, tn.nb} {
			for k, p := range n.must(nodeCmd{Op: "show"}).Peers {
				if !p.Handshake {
					return fmt.Errorf("no handshake with %s yet", k)
				}
			}
		}
		return nil
	})
	_, lines := capt.Stop()
	initiation := func(from, to string) int {
		re := regexp.MustCompile(`^\S+ IP ` + regexp.QuoteMeta(from) + `\.51820 > ` + regexp.QuoteMeta(to) + `\.51820: UDP, length 148$`)
		n := 0
		for _, l := range lines {
			if re.MatchString(l) {
				n++
			}
		}
		return n
	}
	if n := initiation(highIP, lowIP); n != 0 {
		t.Errorf("the higher key's node sent %d handshake initiations; it must only answer:\n%s", n, strings.Join(lines, "\n"))
	}
	if n := initiation(lowIP, highIP); n == 0 {
		t.Errorf("the lower key's node sent no handshake initiation:\n%s", strings.Join(lines, "\n"))
	}
	if p := highNode.must(nodeCmd{Op: "show"}).Peers[low]; p.Keepalive != 0 {
		t.Errorf("the higher key's node has keepalive %v for its new peer during its quiet time, want 0", p.Keepalive)
	}
	if p := lowNode.must(nodeCmd{Op: "show"}).Peers[high]; p.Keepalive != 25*time.Second {
		t.Errorf("the lower key's node has keepalive %v, want 25s", p.Keepalive)
	}
}

// Peers added quietly get their keepalive when their quiet time is over,
// also one added while another is still quiet (the device's one timer arms
// itself again), and the next SetPeers keeps it (no flip back to quiet).
// A quiet time shorter than the write that adds the peer (1 ns) ends the
// same way: the time starts once the peer is on the device, so speakUp
// never comes first and finds no peer to turn the keepalive on for.
func TestQuietPeerSpeaksUp(t *testing.T) {
	for _, quiet := range []time.Duration{300 * time.Millisecond, time.Nanosecond} {
		t.Run(quiet.String(), func(t *testing.T) {
			n := testenv.NewNS(t)
			nd := startNode(t, n)
			nd.must(nodeCmd{Op: "quiet", Quiet: quiet})
			name := devName("q")
			r := nd.must(nodeCmd{Op: "ensure", Name: name, KeyFile: t.TempDir() + "/k.key", Port: 51820, MTU: 1420, Userspace: UserspaceAlways})
			self := mustKey(t, r.Public)
			lower := func() string {
				for {
					k, err := wgtypes.GeneratePrivateKey()
					if err != nil {
						t.Fatal(err)
					}
					if p := k.PublicKey(); bytes.Compare(self[:], p[:]) > 0 {
						return p.String() // a lower key than this node's: this node stays quiet
					}
				}
			}
			one := nodePeer{Key: lower(), Endpoint: "192.0.2.1:51820", Allowed: []string{"10.244.9.0/24"}, Keepalive: 25 * time.Second}
			two := nodePeer{Key: lower(), Endpoint: "192.0.2.2:51820", Allowed: []string{"10.244.10.0/24"}, Keepalive: 25 * time.Second}
			if got := nd.must(nodeCmd{Op: "peers", Peers: []nodePeer{one}}).Changed; got != 1 {
				t.Fatalf("adding the first peer changed %d peers, want 1", got)
			}
			// The second one is added during the first one's quiet time, or just
			// after it: it speaks up on time as well.
			set := nodeCmd{Op: "peers", Peers: []nodePeer{one, two}}
			// With a quiet time over before this write, the write may also
			// turn the first one's keepalive on itself (speakUp not yet
			// come round): one or two changes then.
			most := 1
			if quiet < time.Millisecond {
				most = 2
			}
			if got := nd.must(set).Changed; got < 1 || got > most {
				t.Fatalf("adding the second peer changed %d peers, want 1 to %d", got, most)
			}
			testenv.WaitFor(t, "the quiet peers' keepalives turned on", func() error {
				ps := nd.must(nodeCmd{Op: "show"}).Peers
				for _, p := range []nodePeer{one, two} {
					if ka := ps[p.Key].Keepalive; ka != 25*time.Second {
						return fmt.Errorf("peer %s keepalive %v", p.Key, ka)
					}
				}
				return nil
			})
			if got := nd.must(set).Changed; got != 0 {
				t.Fatalf("SetPeers after the quiet time changed %d peers, want 0", got)
			}
		})
	}
}

func mustKey(t testing.TB, s string) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.ParseKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
