package members_test

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/members"
)

type node struct {
	name string
	*testenv.LANHost
	m *members.Members
}

// testKey is the gossip key of the nodes lan makes.
var testKey = []byte("0123456789abcdef")

// lan makes n nodes on one LAN, each running the gossip.
func lan(t *testing.T, n int) (*testenv.LAN, []*node) {
	l := testenv.NewLAN(t)
	var peers []string
	for i := 1; i <= n; i++ {
		peers = append(peers, fmt.Sprintf("192.168.78.%d", 10+i))
	}
	var nodes []*node
	for i := 1; i <= n; i++ {
		nodes = append(nodes, join(t, l, fmt.Sprintf("node-%d", i), peers[i-1], peers, testKey))
	}
	return l, nodes
}

// join starts a node named name at addr on l, gossiping with peers under
// key (none: unauthenticated).
func join(t *testing.T, l *testenv.LAN, name, addr string, peers []string, key []byte) *node {
	t.Helper()
	nd := &node{name: name, LANHost: l.Host("eth0", addr+"/24")}
	cfg := members.Config{
		Name:  nd.name,
		Addr:  netip.MustParseAddr(addr),
		Peers: peers,
		Key:   key,
		Dial:  testenv.DialerIn(nd.NS),
	}
	if err := testenv.InNS(nd.NS, func() (err error) {
		nd.m, err = members.Start(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.m.Close() })
	return nd
}

func names(nodes []*node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.name)
	}
	slices.Sort(out)
	return out
}

// seeLive waits until every node of viewers sees exactly want alive.
func seeLive(t *testing.T, what string, viewers []*node, want []string) time.Duration {
	t.Helper()
	return testenv.WaitFor(t, what, func() error {
		for _, v := range viewers {
			if got := v.m.Live(); !slices.Equal(got, want) {
				return fmt.Errorf("%s sees %v", v.name, got)
			}
		}
		return nil
	})
}

// TestDropOffAndReturn: the agents find each other; a node whose uplink
// goes down is seen gone by the others, stops trusting its own view when
// Reset (as the speaker does on every change of the LAN link), and is
// seen alive again (and settles after an exchange) when the uplink comes
// back and it is Reset again.
func TestDropOffAndReturn(t *testing.T) {
	l, nodes := lan(t, 3)
	all := names(nodes)
	seeLive(t, "every agent sees every other", nodes, all)
	testenv.WaitFor(t, "every agent settled", func() error {
		for _, n := range nodes {
			if !n.m.Settled() {
				return fmt.Errorf("%s not settled", n.name)
			}
		}
		return nil
	})
	for round := range 3 {
		gone, rest := nodes[0], nodes[1:]
		l.Unplug(gone.LANHost)
		gone.m.Reset()
		if gone.m.Settled() {
			t.Fatalf("%s still settled right after its Reset", gone.name)
		}
		d := seeLive(t, gone.name+" seen gone", rest, names(rest))
		t.Logf("round %d: %s off the LAN; the others saw it gone after %v", round, gone.name, d.Round(time.Millisecond))
		for _, n := range rest {
			if !n.m.Settled() {
				t.Fatalf("%s lost a peer and stopped trusting its view", n.name)
			}
		}
		l.Plug(gone.LANHost)
		gone.m.Reset()
		d = seeLive(t, gone.name+" seen back", nodes, all)
		t.Logf("round %d: %s back; every agent saw it after %v", round, gone.name, d.Round(time.Millisecond))
		testenv.WaitFor(t, gone.name+" settles again", func() error {
			if !gone.m.Settled() {
				return fmt.Errorf("not settled")
			}
			return nil
		})
		nodes = append(rest, gone)
	}
}

// TestKeyKeepsOthersOut: with a gossip key, a host of the LAN that gossips
// without it, or with another key, never becomes a member (it could
// otherwise win the election of an address and silence it), and sees no
// member itself. A node with the key that joins after the intruders is
// the control: once everyone sees it, the intruders had every chance to
// join (they keep trying every rejoin period).
func TestKeyKeepsOthersOut(t *testing.T) {
	l, nodes := lan(t, 2)
	all := names(nodes)
	seeLive(t, "the keyed agents see each other", nodes, all)
	peers := []string{"192.168.78.11", "192.168.78.12"}
	intruders := []*node{
		join(t, l, "aaa-no-key", "192.168.78.21", peers, nil),
		join(t, l, "aaa-other-key", "192.168.78.22", peers, []byte("fedcba9876543210")),
	}
	late := join(t, l, "node-3", "192.168.78.13", peers, testKey)
	members := append(nodes, late)
	seeLive(t, "every keyed agent sees the late one", members, names(members))
	for _, n := range members {
		if got := n.m.Live(); !slices.Equal(got, names(members)) {
			t.Errorf("%s sees %v, want only the keyed agents %v", n.name, got, names(members))
		}
	}
	for _, in := range intruders {
		if got := in.m.Live(); !slices.Equal(got, []string{in.name}) {
			t.Errorf("intruder %s sees %v, want only itself", in.name, got)
		}
	}
}

// clock is a test's clock for the settle and alone waits
// (members.SetClock), moved by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// startAlone starts the agent name at addr on l, with Alone 2 s on a
// clock of the test's (the real rejoin loop runs beside the test's own
// passes, both on that clock).
func startAlone(t *testing.T, l *testenv.LAN, name, addr string) (*members.Members, *clock) {
	t.Helper()
	h := l.Host("eth0", addr+"/24")
	var m *members.Members
	if err := testenv.InNS(h.NS, func() (err error) {
		m, err = members.Start(members.Config{Name: name, Addr: netip.MustParseAddr(addr), Key: testKey,
			Alone: 2 * time.Second, Dial: testenv.DialerIn(h.NS)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	c := &clock{t: time.Unix(1_000_000, 0)}
	members.SetClock(m, c.now)
	return m, c
}

// settledAfter moves c by d, runs a pass of m's rejoin loop and says
// whether m is settled then.
func settledAfter(m *members.Members, c *clock, d time.Duration) bool {
	c.advance(d)
	members.Rejoin(m)
	return m.Settled()
}

// TestWaitsForUnpublishedNodes: an agent that knows of no peer address
// but of another Node (which has published no gossip address yet, as
// every Node of a cluster whose agents all start at once) is not settled
// at once: it waits for an exchange or for Alone. An agent whose Nodes
// are only itself settles at once.
func TestWaitsForUnpublishedNodes(t *testing.T) {
	l := testenv.NewLAN(t)
	single, _ := startAlone(t, l, "node-1", "192.168.78.21")
	single.SetNodes(map[string]string{"node-1": "192.168.78.21:7947"})
	if !single.Settled() {
		t.Errorf("the only Node's agent is not settled at once")
	}

	m, c := startAlone(t, l, "node-2", "192.168.78.22")
	m.SetNodes(map[string]string{"node-2": "192.168.78.22:7947", "node-3": ""})
	if m.Settled() {
		t.Fatalf("an agent with another Node that published no gossip address is settled at once")
	}
	if settledAfter(m, c, 1999*time.Millisecond) {
		t.Fatalf("settled before Alone (2s)")
	}
	if !settledAfter(m, c, time.Millisecond) {
		t.Fatalf("not settled alone after Alone (2s)")
	}
}

// TestNewPeerRestartsAlone: a peer address learned while the agent has
// not settled gives that peer Alone to answer from then, not from the
// agent's start: on a fresh cluster the gossip addresses are published
// only once the agents may write, and an agent must not settle alone just
// as its peers become known. Once settled, a new peer changes nothing.
func TestNewPeerRestartsAlone(t *testing.T) {
	l := testenv.NewLAN(t)
	m, c := startAlone(t, l, "node-1", "192.168.78.31")
	m.SetNodes(map[string]string{"node-1": "192.168.78.31:7947", "node-2": ""})
	if settledAfter(m, c, time.Second) {
		t.Fatalf("settled before Alone")
	}
	// Half of Alone gone, node-2 publishes an address nothing answers on.
	m.SetPeers([]string{"192.168.78.32"})
	m.SetNodes(map[string]string{"node-1": "192.168.78.31:7947", "node-2": "192.168.78.32:7947"})
	if settledAfter(m, c, time.Second) {
		t.Fatalf("settled Alone after its start, 1s after learning node-2's address: not Alone (2s) from then")
	}
	if !settledAfter(m, c, time.Second) {
		t.Fatalf("not settled alone Alone (2s) after learning node-2's address")
	}
	m.SetPeers([]string{"192.168.78.32", "192.168.78.33"})
	if !m.Settled() {
		t.Errorf("a new peer unsettled a settled agent")
	}
}
