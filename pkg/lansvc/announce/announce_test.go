package announce_test

import (
	"errors"
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

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/announce"
)

var (
	vip4 = netip.MustParseAddr("192.168.77.200")
	vip6 = netip.MustParseAddr("fd77::200")
)

// host puts a namespace on l with eth0 holding host number num in
// 192.168.77.0/24 and fd77::/64.
func host(l *testenv.LAN, num int) *testenv.LANHost {
	return l.Host("eth0", fmt.Sprintf("192.168.77.%d/24", num), fmt.Sprintf("fd77::%d/64", num))
}

// announcer opens an Announcer on ifname inside h's namespace.
func announcer(t *testing.T, h *testenv.LANHost, ifname string) *announce.Announcer {
	t.Helper()
	var a *announce.Announcer
	if err := testenv.InNS(h.NS, func() (err error) {
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
	testenv.WaitFor(t, fmt.Sprintf("%s resolved to %s", ip, want), func() error {
		_ = testenv.Ping(n, ip.String(), 1)
		if got := neighMAC(n, ip); got != want.String() {
			return fmt.Errorf("neighbour entry has %q", got)
		}
		return nil
	})
}

// arpAnswers asks once for ip from client's eth0 and returns every
// distinct MAC that answered within a second.
func arpAnswers(t *testing.T, client *testenv.LANHost, ip netip.Addr) []string {
	t.Helper()
	macs, err := testenv.ARPAnswers(client.NS, "eth0", ip, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return macs
}

// TestAnswersOnlyHeldAddressesOnTheLANInterface: the node answers ARP and
// NDP for the addresses it holds, with its LAN MAC, only on the LAN
// interface, and traffic to them reaches that interface.
func TestAnswersOnlyHeldAddressesOnTheLANInterface(t *testing.T) {
	l := testenv.NewLAN(t)
	node := host(l, 11)
	client := host(l, 100)
	// A second LAN on another interface of the node: the address must
	// never be answered there.
	other := testenv.NewLAN(t)
	otherClient := host(other, 101)
	other.Attach(node.NS, "eth1")

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
		resolve(t, client.NS, vip4, node.MAC)
		if got := arpAnswers(t, client, vip4); len(got) != 1 || got[0] != node.MAC.String() {
			t.Fatalf("ARP answers for %s: %v, want exactly [%s]", vip4, got, node.MAC)
		}
	})
	t.Run("NDP", func(t *testing.T) {
		resolve(t, client.NS, vip6, node.MAC)
		// Unicast solicitations (a neighbour checking the entry) are
		// answered too: reprobe makes the kernel send one.
		testenv.MustIP(t, client.NS, "neigh", "change", vip6.String(), "lladdr", node.MAC.String(), "dev", "eth0", "nud", "probe")
		testenv.WaitFor(t, "unicast solicitation answered", func() error {
			out, _ := testenv.IP(client.NS, "neigh", "show", vip6.String(), "dev", "eth0")
			if !strings.Contains(out, "REACHABLE") {
				return fmt.Errorf("entry: %s", out)
			}
			return nil
		})
	})
	t.Run("TrafficReachesTheLANInterface", func(t *testing.T) {
		for _, ip := range []netip.Addr{vip4, vip6} {
			c := testenv.StartCapture(t, node.NS, "eth0", "dst host "+ip.String()+" and tcp port 8080")
			_ = testenv.Dial(client.NS, ip.String(), 8080, 2*time.Second)
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
			unresolved(t, otherClient, ip, "on the node's other interface")
		}
	})
	t.Run("StopsWhenReleased", func(t *testing.T) {
		if err := a.Set(nil); err != nil {
			t.Fatal(err)
		}
		if got := arpAnswers(t, client, vip4); len(got) != 0 {
			t.Fatalf("ARP answers for released %s: %v", vip4, got)
		}
		unresolved(t, client, vip6, "after its release")
	})
}

// unresolved flushes host's neighbour entries, then waits until its
// kernel gives up resolving ip (FAILED); an answer (an entry with a MAC)
// fails the test at once: nobody may answer for ip, as where says.
func unresolved(t *testing.T, host *testenv.LANHost, ip netip.Addr, where string) {
	t.Helper()
	testenv.MustIP(t, host.NS, "neigh", "flush", "dev", "eth0")
	testenv.WaitFor(t, "resolution of "+ip.String()+" "+where+" fails", func() error {
		_ = testenv.Ping(host.NS, ip.String(), 1)
		out, _ := testenv.IP(host.NS, "neigh", "show", ip.String(), "dev", "eth0")
		if strings.Contains(out, "lladdr") {
			t.Fatalf("%s answered %s: %s", ip, where, out)
		}
		if !strings.Contains(out, "FAILED") {
			return fmt.Errorf("entry: %q", out)
		}
		return nil
	})
}

// TestTakeoverAnnounces: a node does not take an address another node
// still answers for; once that one lets it go, its burst of gratuitous
// ARP (both forms) and unsolicited advertisements moves a client's
// existing neighbour entries to its MAC with no new question from the
// client.
func TestTakeoverAnnounces(t *testing.T) {
	l := testenv.NewLAN(t)
	n1 := host(l, 11)
	n2 := host(l, 12)
	client := host(l, 100)
	a1 := announcer(t, n1, "eth0")
	a2 := announcer(t, n2, "eth0")
	if err := a1.Set([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	resolve(t, client.NS, vip4, n1.MAC)
	resolve(t, client.NS, vip6, n1.MAC)

	// While n1 answers, n2's probes are answered: it takes nothing.
	err := a2.Set([]netip.Addr{vip4, vip6})
	if !errors.Is(err, announce.ErrContested) || !strings.Contains(err.Error(), vip4.String()) || !strings.Contains(err.Error(), vip6.String()) {
		t.Fatalf("n2's Set while n1 holds both: %v, want both contested", err)
	}
	if h := a2.Held(); len(h) != 0 {
		t.Fatalf("n2 holds %v while n1 answers", h)
	}
	if got := arpAnswers(t, client, vip4); len(got) != 1 || got[0] != n1.MAC.String() {
		t.Fatalf("ARP answers for %s with n2 contested: %v, want exactly [%s]", vip4, got, n1.MAC)
	}

	c := testenv.StartCapture(t, client.NS, "eth0", "arp or icmp6")
	if err := a1.Set(nil); err != nil {
		t.Fatal(err)
	}
	if err := a2.Set([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{vip4, vip6} {
		testenv.WaitFor(t, "client's entry for "+ip.String()+" moves to "+n2.MAC.String(), func() error {
			if got := neighMAC(client.NS, ip); got != n2.MAC.String() {
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
		q(n2.MAC.String()+" > ff:ff:ff:ff:ff:ff, ethertype ARP (0x0806), length ") + `\d+` + q(": Request who-has "+vip4.String()+" tell "+vip4.String()+","),
		q(n2.MAC.String()+" > ff:ff:ff:ff:ff:ff, ethertype ARP (0x0806), length ") + `\d+` + q(": Reply "+vip4.String()+" is-at "+n2.MAC.String()+","),
		q(n2.MAC.String()+" > 33:33:00:00:00:01, ") + `.*` + q(" > ff02::1: ICMP6, neighbor advertisement, tgt is "+vip6.String()+","),
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
	if got := arpAnswers(t, client, vip4); len(got) != 1 || got[0] != n2.MAC.String() {
		t.Fatalf("ARP answers for %s after takeover: %v, want exactly [%s]", vip4, got, n2.MAC)
	}
}

// TestRefusesWhatTheInterfaceCannotServe: an IPv6 address on an interface
// with no IPv6, and addresses that are not unicast LAN addresses, are
// refused by name while the rest of the set applies.
func TestRefusesWhatTheInterfaceCannotServe(t *testing.T) {
	l := testenv.NewLAN(t)
	n := host(l, 11)
	testenv.MustIP(t, n.NS, "-6", "addr", "flush", "dev", "eth0")
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.NS.Path()), "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1").CombinedOutput(); err != nil {
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
