package announce_test

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mdlayher/arp"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/announce"
)

// wait bounds every condition these tests wait for; they return as soon
// as it holds.
const wait = time.Minute

var (
	vip4 = netip.MustParseAddr("192.168.77.200")
	vip6 = netip.MustParseAddr("fd77::200")
)

// lan is a LAN bridge in its own namespace, with hosts on it.
type lan struct {
	t  *testing.T
	ns ns.NetNS
	n  int
}

func newLAN(t *testing.T) *lan {
	l := &lan{t: t, ns: testenv.NewNS(t)}
	testenv.MustIP(t, l.ns, "link", "add", "br0", "type", "bridge")
	testenv.MustIP(t, l.ns, "link", "set", "br0", "up")
	return l
}

// host is a namespace with eth0 on the LAN, holding the given host number
// in 192.168.77.0/24 and fd77::/64.
type host struct {
	ns  ns.NetNS
	mac net.HardwareAddr
}

func (l *lan) host(num int, ifname string) host {
	t := l.t
	h := host{ns: testenv.NewNS(t)}
	l.n++
	port := fmt.Sprintf("p%d", l.n)
	testenv.MustIP(t, l.ns, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", filepath.Base(h.ns.Path()))
	testenv.MustIP(t, l.ns, "link", "set", port, "master", "br0", "up")
	testenv.MustIP(t, h.ns, "addr", "add", fmt.Sprintf("192.168.77.%d/24", num), "dev", ifname)
	testenv.MustIP(t, h.ns, "addr", "add", fmt.Sprintf("fd77::%d/64", num), "dev", ifname, "nodad")
	testenv.MustIP(t, h.ns, "link", "set", ifname, "up")
	h.mac = mac(t, h.ns, ifname)
	// The link-local address must leave duplicate detection before the
	// kernel sources advertisements from it.
	poll(t, "link-local address of "+ifname, func() error {
		out, err := testenv.IP(h.ns, "-6", "addr", "show", "dev", ifname, "scope", "link")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "fe80::") || strings.Contains(out, "tentative") {
			return fmt.Errorf("not ready: %s", out)
		}
		return nil
	})
	return h
}

func mac(t *testing.T, n ns.NetNS, ifname string) net.HardwareAddr {
	t.Helper()
	var hw net.HardwareAddr
	if err := testenv.InNS(n, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		hw = ifi.HardwareAddr
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return hw
}

func poll(t *testing.T, what string, f func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %s: %v", what, wait, err)
}

// announcer opens an Announcer on ifname inside h's namespace.
func announcer(t *testing.T, h host, ifname string) *announce.Announcer {
	t.Helper()
	var a *announce.Announcer
	if err := testenv.InNS(h.ns, func() (err error) {
		a, err = announce.New(announce.Config{Interface: ifname})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

var lladdr = regexp.MustCompile(`lladdr ([0-9a-f:]{17})`)

// neighMAC is the MAC the kernel of n has for ip on eth0, or "" when it
// has none.
func neighMAC(n ns.NetNS, ip netip.Addr) string {
	out, _ := testenv.IP(n, "neigh", "show", ip.String(), "dev", "eth0")
	if m := lladdr.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// resolve makes the kernel of n resolve ip (a ping that nobody answers:
// the address is on no interface) until it has want for it.
func resolve(t *testing.T, n ns.NetNS, ip netip.Addr, want net.HardwareAddr) {
	t.Helper()
	poll(t, fmt.Sprintf("%s resolved to %s", ip, want), func() error {
		_ = testenv.Ping(n, ip.String(), 1)
		if got := neighMAC(n, ip); got != want.String() {
			return fmt.Errorf("neighbour entry has %q", got)
		}
		return nil
	})
}

// arpAnswers asks for ip once from client's eth0 and returns every
// distinct MAC that answered within a second.
func arpAnswers(t *testing.T, client host, ip netip.Addr) []string {
	t.Helper()
	var macs []string
	if err := testenv.InNS(client.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err := arp.Dial(ifi)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.Request(ip); err != nil {
			return err
		}
		seen := map[string]bool{}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		for {
			p, _, err := c.Read()
			if err != nil {
				return nil // the deadline
			}
			if p.Operation == arp.OperationReply && p.SenderIP == ip && !seen[p.SenderHardwareAddr.String()] {
				seen[p.SenderHardwareAddr.String()] = true
				macs = append(macs, p.SenderHardwareAddr.String())
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	return macs
}

// TestAnswersOnlyHeldAddressesOnTheLANInterface: the node answers ARP and
// NDP for the addresses it holds, with its LAN MAC, only on the LAN
// interface, and traffic to them reaches that interface.
func TestAnswersOnlyHeldAddressesOnTheLANInterface(t *testing.T) {
	l := newLAN(t)
	node := l.host(11, "eth0")
	client := l.host(100, "eth0")
	// A second LAN on another interface of the node: the address must
	// never be answered there.
	other := newLAN(t)
	otherClient := other.host(101, "eth0")
	testenv.MustIP(t, other.ns, "link", "add", "px", "type", "veth", "peer", "name", "eth1", "netns", filepath.Base(node.ns.Path()))
	testenv.MustIP(t, other.ns, "link", "set", "px", "master", "br0", "up")
	testenv.MustIP(t, node.ns, "link", "set", "eth1", "up")

	a := announcer(t, node, "eth0")
	if err := a.Set([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	if err := a.Set([]netip.Addr{vip6, vip4}); err != nil { // a repeat
		t.Fatal(err)
	}
	if got := a.Held(); len(got) != 2 || got[0] != vip4 || got[1] != vip6 {
		t.Fatalf("Held() = %v", got)
	}

	t.Run("ARP", func(t *testing.T) {
		resolve(t, client.ns, vip4, node.mac)
		if got := arpAnswers(t, client, vip4); len(got) != 1 || got[0] != node.mac.String() {
			t.Fatalf("ARP answers for %s: %v, want exactly [%s]", vip4, got, node.mac)
		}
	})
	t.Run("NDP", func(t *testing.T) {
		resolve(t, client.ns, vip6, node.mac)
		// Unicast solicitations (a neighbour checking the entry) are
		// answered too: reprobe makes the kernel send one.
		testenv.MustIP(t, client.ns, "neigh", "change", vip6.String(), "lladdr", node.mac.String(), "dev", "eth0", "nud", "probe")
		poll(t, "unicast solicitation answered", func() error {
			out, _ := testenv.IP(client.ns, "neigh", "show", vip6.String(), "dev", "eth0")
			if !strings.Contains(out, "REACHABLE") {
				return fmt.Errorf("entry: %s", out)
			}
			return nil
		})
	})
	t.Run("TrafficReachesTheLANInterface", func(t *testing.T) {
		for _, ip := range []netip.Addr{vip4, vip6} {
			c := testenv.StartCapture(t, node.ns, "eth0", "dst host "+ip.String()+" and tcp port 8080")
			_ = testenv.Dial(client.ns, ip.String(), 8080, 2*time.Second)
			out := c.Stop()
			if !strings.Contains(out, ip.String()+".8080: Flags [S]") {
				t.Errorf("no SYN to %s:8080 captured on the node's eth0:\n%s", ip, out)
			}
		}
	})
	t.Run("NeverOnAnotherInterface", func(t *testing.T) {
		// The other LAN's client tries to resolve; the kernel gives up
		// (FAILED) and no answer ever came from the node.
		for _, ip := range []netip.Addr{vip4, vip6} {
			testenv.MustIP(t, otherClient.ns, "neigh", "flush", "dev", "eth0")
			poll(t, "resolution of "+ip.String()+" on the other LAN fails", func() error {
				_ = testenv.Ping(otherClient.ns, ip.String(), 1)
				out, _ := testenv.IP(otherClient.ns, "neigh", "show", ip.String(), "dev", "eth0")
				if strings.Contains(out, "lladdr") {
					t.Fatalf("%s answered on the node's other interface: %s", ip, out)
				}
				if !strings.Contains(out, "FAILED") {
					return fmt.Errorf("entry: %q", out)
				}
				return nil
			})
		}
	})
	t.Run("StopsWhenReleased", func(t *testing.T) {
		if err := a.Set(nil); err != nil {
			t.Fatal(err)
		}
		if got := arpAnswers(t, client, vip4); len(got) != 0 {
			t.Fatalf("ARP answers for released %s: %v", vip4, got)
		}
		testenv.MustIP(t, client.ns, "neigh", "flush", "dev", "eth0")
		poll(t, "resolution of released "+vip6.String()+" fails", func() error {
			_ = testenv.Ping(client.ns, vip6.String(), 1)
			out, _ := testenv.IP(client.ns, "neigh", "show", vip6.String(), "dev", "eth0")
			if strings.Contains(out, "lladdr") {
				t.Fatalf("released %s still answered: %s", vip6, out)
			}
			if !strings.Contains(out, "FAILED") {
				return fmt.Errorf("entry: %q", out)
			}
			return nil
		})
	})
}

// TestTakeoverAnnounces: when another node takes an address over, its
// burst of gratuitous ARP (both forms) and unsolicited advertisements
// moves a client's existing neighbour entries to its MAC with no new
// question from the client.
func TestTakeoverAnnounces(t *testing.T) {
	l := newLAN(t)
	n1 := l.host(11, "eth0")
	n2 := l.host(12, "eth0")
	client := l.host(100, "eth0")
	a1 := announcer(t, n1, "eth0")
	a2 := announcer(t, n2, "eth0")
	if err := a1.Set([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	resolve(t, client.ns, vip4, n1.mac)
	resolve(t, client.ns, vip6, n1.mac)

	c := testenv.StartCapture(t, client.ns, "eth0", "arp or icmp6")
	if err := a2.Set([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	if err := a1.Set(nil); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{vip4, vip6} {
		poll(t, "client's entry for "+ip.String()+" moves to "+n2.mac.String(), func() error {
			if got := neighMAC(client.ns, ip); got != n2.mac.String() {
				return fmt.Errorf("entry has %q", got)
			}
			return nil
		})
	}
	out := c.Stop()
	q := regexp.QuoteMeta
	for _, want := range []string{
		// The request form (RFC 5227 announcement) and the reply form,
		// both broadcast, and the advertisement to all nodes.
		q(n2.mac.String()+" > ff:ff:ff:ff:ff:ff, ethertype ARP (0x0806), length ") + `\d+` + q(": Request who-has "+vip4.String()+" tell "+vip4.String()+","),
		q(n2.mac.String()+" > ff:ff:ff:ff:ff:ff, ethertype ARP (0x0806), length ") + `\d+` + q(": Reply "+vip4.String()+" is-at "+n2.mac.String()+","),
		q(n2.mac.String()+" > 33:33:00:00:00:01, ") + `.*` + q(" > ff02::1: ICMP6, neighbor advertisement, tgt is "+vip6.String()+","),
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("capture on the client lacks /%s/:\n%s", want, out)
		}
	}
	// The client asked nothing between the takeover and its entries
	// moving: the move came from the announcements.
	if strings.Contains(out, "who-has "+vip4.String()+" tell 192.168.77.100") {
		t.Errorf("the client had to ask for %s:\n%s", vip4, out)
	}
	if cs := a2.Counters(); cs.Gratuitous == 0 || cs.Unsolicited == 0 {
		t.Errorf("counters after takeover: %+v", cs)
	}
	if got := arpAnswers(t, client, vip4); len(got) != 1 || got[0] != n2.mac.String() {
		t.Fatalf("ARP answers for %s after takeover: %v, want exactly [%s]", vip4, got, n2.mac)
	}
}

// TestRefusesWhatTheInterfaceCannotServe: an IPv6 address on an interface
// with no IPv6, and addresses that are not unicast LAN addresses, are
// refused by name while the rest of the set applies.
func TestRefusesWhatTheInterfaceCannotServe(t *testing.T) {
	l := newLAN(t)
	n := l.host(11, "eth0")
	testenv.MustIP(t, n.ns, "-6", "addr", "flush", "dev", "eth0")
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.ns.Path()), "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1").CombinedOutput(); err != nil {
		t.Fatalf("disable IPv6: %v: %s", err, out)
	}
	a := announcer(t, n, "eth0")
	err := a.Set([]netip.Addr{vip4, vip6, netip.MustParseAddr("224.0.0.1")})
	if err == nil || !strings.Contains(err.Error(), vip6.String()) || !strings.Contains(err.Error(), "224.0.0.1") {
		t.Fatalf("Set error = %v, want one naming %s and 224.0.0.1", err, vip6)
	}
	if got := a.Held(); len(got) != 1 || got[0] != vip4 {
		t.Fatalf("Held() = %v, want [%s]", got, vip4)
	}
}
