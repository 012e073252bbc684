package members_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/members"
)

// fakes starts n gossip agents named prefix-0.. on one LAN host at addr,
// each on its own port, joining peer, without a key: a LAN host that
// joins the gossip under as many names as it likes.
func fakes(t *testing.T, l *testenv.LAN, addr, prefix string, n int, peer string) []*members.Members {
	t.Helper()
	h := l.Host("eth0", addr+"/24")
	var out []*members.Members
	for i := range n {
		cfg := members.Config{Name: fmt.Sprintf("%s-%d", prefix, i), Addr: netip.MustParseAddr(addr), Port: 9000 + i,
			Peers: []string{peer}, Dial: testenv.DialerIn(h.NS)}
		var m *members.Members
		if err := testenv.InNS(h.NS, func() (err error) { m, err = members.Start(cfg); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		out = append(out, m)
	}
	return out
}

// TestMembersBoundedAndNodesOnly: a LAN host without the gossip key that
// joins under many names grows the member map no further than MaxMembers,
// and the real nodes stay in it; once the Kubernetes Nodes are known,
// only they count, each only from the address it published, so a host
// joining under a Node's name from its own address is not alive.
func TestMembersBoundedAndNodesOnly(t *testing.T) {
	l := testenv.NewLAN(t)
	peers := []string{"192.168.78.11", "192.168.78.12"}
	start := func(name, addr string, max int) *node {
		nd := &node{name: name, LANHost: l.Host("eth0", addr+"/24")}
		cfg := members.Config{Name: name, Addr: netip.MustParseAddr(addr), Peers: peers, Dial: testenv.DialerIn(nd.NS), MaxMembers: max}
		if err := testenv.InNS(nd.NS, func() (err error) { nd.m, err = members.Start(cfg); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if nd.m != nil {
				_ = nd.m.Close()
			}
		})
		return nd
	}
	const max = 5
	n1 := start("node-1", peers[0], max)
	n2 := start("node-2", peers[1], max)
	seeLive(t, "both nodes alive", []*node{n1, n2}, []string{"node-1", "node-2"})

	fs := fakes(t, l, "192.168.78.50", "fake", 3*max, peers[0]+":7947")
	testenv.WaitFor(t, "every fake joined node-1 and some were refused", func() error {
		for i, f := range fs {
			if !slices.Contains(f.Live(), "node-1") {
				return fmt.Errorf("fake-%d sees %v", i, f.Live())
			}
		}
		if n1.m.Refused() == 0 {
			return fmt.Errorf("node-1 refused nothing; sees %v", n1.m.Live())
		}
		return nil
	})
	live := n1.m.Live()
	if len(live) > max+1 || !slices.Contains(live, "node-2") {
		t.Fatalf("node-1 sees %d members %v, want at most %d besides itself, node-2 among them", len(live), live, max)
	}

	// The Nodes are known: only they count, from their own addresses.
	nodes := map[string]string{"node-1": peers[0] + ":7947", "node-2": peers[1] + ":7947"}
	n1.m.SetNodes(nodes)
	if got := n1.m.Live(); !slices.Equal(got, []string{"node-1", "node-2"}) {
		t.Fatalf("node-1 sees %v once the Nodes are known", got)
	}
	// node-2 goes; a host takes its name from another address.
	if err := n2.m.Close(); err != nil {
		t.Fatal(err)
	}
	n2.m = nil
	seeLive(t, "node-2 gone", []*node{n1}, []string{"node-1"})
	before := n1.m.Refused()
	// One under a new name, one under node-2's.
	fakes(t, l, "192.168.78.60", "node-3", 1, peers[0]+":7947")
	cfg := members.Config{Name: "node-2", Addr: netip.MustParseAddr("192.168.78.62"), Peers: []string{peers[0] + ":7947"}}
	h := l.Host("eth0", "192.168.78.62/24")
	cfg.Dial = testenv.DialerIn(h.NS)
	var m *members.Members
	if err := testenv.InNS(h.NS, func() (err error) { m, err = members.Start(cfg); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	testenv.WaitFor(t, "node-1 refused the impostors", func() error {
		if !slices.Contains(m.Live(), "node-1") {
			return fmt.Errorf("the impostor sees %v", m.Live())
		}
		if n1.m.Refused() < before+2 {
			return fmt.Errorf("refused %d", n1.m.Refused()-before)
		}
		return nil
	})
	if n1.m.Alive("node-2") || !slices.Equal(n1.m.Live(), []string{"node-1"}) {
		t.Fatalf("node-1 sees %v (node-2 alive: %v) with only impostors on the LAN", n1.m.Live(), n1.m.Alive("node-2"))
	}
}
