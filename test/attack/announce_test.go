package attack_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/announce"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/lansvc/members"
	"github.com/village-cni/village/pkg/lansvc/speaker"
)

// gossiper starts a gossip agent named name at addr (a new host on l)
// joining peers, without a key.
func gossiper(t *testing.T, l *testenv.LAN, name, addr string, peers []string) (*testenv.LANHost, *members.Members) {
	t.Helper()
	h := l.Host("eth0", addr+"/24")
	var m *members.Members
	if err := testenv.InNS(h.NS, func() (err error) {
		m, err = members.Start(members.Config{Name: name, Addr: netip.MustParseAddr(addr), Peers: peers, Dial: testenv.DialerIn(h.NS)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return h, m
}

// TestAnnounceGossipImpostors: a LAN host with no gossip key (the gossip
// runs in the clear) joins the agents' gossip, once under a new name that
// would win the election of the Service writer, once under the name of a
// Node whose agent is down (which would make that Node the announcer of
// its addresses, and them silent). The agent knows the Nodes and the
// gossip address each published: neither impostor counts as alive, so
// neither is writer nor announcer.
func TestAnnounceGossipImpostors(t *testing.T) {
	testenv.RequireRoot(t)
	l := testenv.NewLAN(t)
	a1, a2 := "192.168.79.11", "192.168.79.12"
	_, n1 := gossiper(t, l, "node-1", a1, []string{a2})
	n1.SetNodes(map[string]string{"node-1": a1 + ":7947", "node-2": a2 + ":7947"})
	vip := netip.MustParseAddr("192.168.79.200")
	key := "Service home/web"
	// A new name that would be the writer of key beside node-1, and owner
	// of vip were it eligible.
	newName := ""
	for i := 0; newName == ""; i++ {
		if n := fmt.Sprintf("evil-%d", i); elect.Writer(key, []string{"node-1", n}) == n {
			newName = n
		}
	}
	// node-2 is down; with node-2 alive, it and not node-1 would own vip.
	if elect.Owner(vip, []string{"node-1", "node-2"}, func(string) bool { return true }) != "node-2" {
		vip = netip.MustParseAddr("192.168.79.201")
		if elect.Owner(vip, []string{"node-1", "node-2"}, func(string) bool { return true }) != "node-2" {
			t.Fatal("neither address is node-2's: pick another")
		}
	}
	_, evil := gossiper(t, l, newName, "192.168.79.66", []string{a1 + ":7947"})
	_, fake2 := gossiper(t, l, "node-2", "192.168.79.67", []string{a1 + ":7947"})
	testenv.WaitFor(t, "node-1 refused both impostors", func() error {
		for _, m := range []*members.Members{evil, fake2} {
			if !slices.Contains(m.Live(), "node-1") {
				return fmt.Errorf("an impostor has not reached node-1 yet: %v", m.Live())
			}
		}
		if n1.Refused() < 2 {
			return fmt.Errorf("node-1 refused %d alive messages", n1.Refused())
		}
		return nil
	})
	if live := n1.Live(); !slices.Equal(live, []string{"node-1"}) {
		t.Fatalf("ATTACK SUCCEEDED: node-1 sees %v alive", live)
	}
	if w := elect.Writer(key, n1.Live()); w != "node-1" {
		t.Fatalf("ATTACK SUCCEEDED: the writer of %s is %s", key, w)
	}
	if o := elect.Owner(vip, []string{"node-1", "node-2"}, n1.Alive); o != "node-1" {
		t.Fatalf("ATTACK SUCCEEDED: the announcer of %s is %s", vip, o)
	}
}

// cluster is one Village cluster of one node on the LAN: its gossip, its
// announcer and its speaker.
type cluster struct {
	host *testenv.LANHost
	ann  *announce.Announcer
	spk  *speaker.Speaker
}

func oneNodeCluster(t *testing.T, l *testenv.LAN, name, addr string) *cluster {
	t.Helper()
	c := &cluster{host: l.Host("eth0", addr+"/24")}
	var m *members.Members
	var s *speaker.Speaker
	if err := testenv.InNS(c.host.NS, func() (err error) {
		if m, err = members.Start(members.Config{Name: name, Addr: netip.MustParseAddr(addr), Dial: testenv.DialerIn(c.host.NS)}); err != nil {
			return err
		}
		if c.ann, err = announce.New(announce.Config{Interface: "eth0", Conflict: announce.ConflictTiming{RetryJitter: 300 * time.Millisecond}}); err != nil {
			return err
		}
		s, err = speaker.New(speaker.Config{Node: name, Interface: "eth0", Announcer: c.ann, Members: m})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = c.ann.Close(); _ = m.Close() })
	c.spk = s
	return c
}

// TestAnnounceSecondClusterSameLAN: a second Village cluster on the same
// LAN with an overlapping Service range elects its own node for the same
// address at the same moment. After resolution exactly one MAC answers
// for it (ARP), and the other cluster's node does not answer and reports
// the address in use by the winner's MAC.
func TestAnnounceSecondClusterSameLAN(t *testing.T) {
	testenv.RequireRoot(t)
	l := testenv.NewLAN(t)
	vip := netip.MustParseAddr("192.168.79.210")
	client := l.Host("eth0", "192.168.79.100/24")
	ca := oneNodeCluster(t, l, "a-node", "192.168.79.21")
	cb := oneNodeCluster(t, l, "b-node", "192.168.79.22")
	// Both clusters give the address to their node at the same moment:
	// both probe at once.
	ca.spk.SetWants([]elect.Want{{Addr: vip, Eligible: []string{"a-node"}}})
	cb.spk.SetWants([]elect.Want{{Addr: vip, Eligible: []string{"b-node"}}})
	var winner, loser *cluster
	testenv.WaitFor(t, "one cluster's node holds "+vip.String(), func() error {
		ha, hb := len(ca.ann.Held()) == 1, len(cb.ann.Held()) == 1
		switch {
		case ha && !hb:
			winner, loser = ca, cb
		case hb && !ha:
			winner, loser = cb, ca
		default:
			return fmt.Errorf("a holds %v, b holds %v", ca.ann.Held(), cb.ann.Held())
		}
		if got := loser.ann.InUseBy(vip); got.String() != winner.host.MAC.String() {
			return fmt.Errorf("the other reports %s in use by %q", vip, got)
		}
		return nil
	})
	for range 3 {
		macs, err := testenv.ARPAnswers(client.NS, "eth0", vip, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(macs) != 1 || macs[0] != winner.host.MAC.String() {
			t.Fatalf("ATTACK SUCCEEDED: ARP answers for %s: %v, want exactly [%s]", vip, macs, winner.host.MAC)
		}
	}
	if cs := loser.ann.Contested(); len(cs) != 1 || cs[0].Addr != vip || cs[0].MACText != winner.host.MAC.String() {
		t.Fatalf("the loser reports %+v, want %s contested by %s", cs, vip, winner.host.MAC)
	}
}

// TestAnnounceImpostorDuringHandBack: during a hand-back between two nodes
// of one cluster (node-1 stood in for node-2, which is back and elected:
// node-1 still answers a moment, which node-2 takes for "ask again", as
// node-1's MAC is the one its Node published), a LAN host answers for the
// address too, with its own MAC, to pass for part of the hand-back and
// keep the address unreported. Only the MACs the Nodes published are the
// cluster's: node-2 reports the address in use by the host's MAC (never by
// node-1's), does not take it while the host answers, and takes it, alone,
// once the host stops.
func TestAnnounceImpostorDuringHandBack(t *testing.T) {
	testenv.RequireRoot(t)
	l := testenv.NewLAN(t)
	vip := netip.MustParseAddr("192.168.79.220")
	client := l.Host("eth0", "192.168.79.100/24")
	h1, h2 := l.Host("eth0", "192.168.79.11/24"), l.Host("eth0", "192.168.79.12/24")
	impostor := l.Host("eth0", "192.168.79.66/24")
	open := func(h *testenv.LANHost) *announce.Announcer {
		var a *announce.Announcer
		if err := testenv.InNS(h.NS, func() (err error) {
			// A probe wait a loaded machine cannot miss; the rest as
			// shipped.
			a, err = announce.New(announce.Config{Interface: "eth0", ProbeWait: time.Second})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	n1, n2 := open(h1), open(h2)
	// What each agent read from the other's Node: village.cni.io/lan-mac.
	n1.SetPeers([]net.HardwareAddr{h2.MAC})
	n2.SetPeers([]net.HardwareAddr{h1.MAC})
	if err := n1.Set([]netip.Addr{vip}); err != nil {
		t.Fatal(err)
	}
	// The impostor answers ARP for the address (its kernel holds it).
	testenv.MustIP(t, impostor.NS, "addr", "add", vip.String()+"/24", "dev", "eth0")
	// node-2 is elected and asks, as its speaker does, while node-1 still
	// answers.
	err := n2.Set([]netip.Addr{vip})
	if !errors.Is(err, announce.ErrContested) {
		t.Fatalf("ATTACK SUCCEEDED: node-2 asking for %s with node-1 and the impostor answering: %v, want a conflict", vip, err)
	}
	if got := n2.InUseBy(vip); got.String() != impostor.MAC.String() {
		t.Fatalf("ATTACK SUCCEEDED: node-2 reports %s in use by %q, want the impostor's %s", vip, got, impostor.MAC)
	}
	// node-1 lets go (it sees node-2 alive); the impostor keeps answering.
	if err := n1.Set(nil); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "node-2 asked again with only the impostor answering", func() error {
		err := n2.Set([]netip.Addr{vip})
		if n2.Holds(vip) {
			t.Fatalf("ATTACK SUCCEEDED: node-2 took %s beside the impostor", vip)
		}
		if errors.Is(err, announce.ErrHandBack) {
			return fmt.Errorf("still a hand-back: %v", err)
		}
		return nil
	})
	for _, c := range n2.Contested() {
		if c.MACText != impostor.MAC.String() {
			t.Fatalf("ATTACK SUCCEEDED: node-2 reports %s contested by %s, want the impostor's %s", c.Addr, c.MACText, impostor.MAC)
		}
	}
	// The impostor stops: node-2 takes the address (after the Announcer's
	// own pacing of a contested address) and answers alone.
	testenv.MustIP(t, impostor.NS, "addr", "del", vip.String()+"/24", "dev", "eth0")
	testenv.WaitFor(t, "node-2 takes "+vip.String(), func() error {
		if err := n2.Set([]netip.Addr{vip}); err != nil {
			return err
		}
		return nil
	})
	for range 3 {
		macs, err := testenv.ARPAnswers(client.NS, "eth0", vip, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(macs) != 1 || macs[0] != h2.MAC.String() {
			t.Fatalf("ARP answers for %s: %v, want exactly node-2's [%s]", vip, macs, h2.MAC)
		}
	}
}
