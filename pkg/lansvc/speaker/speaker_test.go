package speaker_test

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/announce"
	"github.com/village-cni/village/pkg/lansvc/elect"
	"github.com/village-cni/village/pkg/lansvc/members"
	"github.com/village-cni/village/pkg/lansvc/speaker"
)

var (
	vip4 = netip.MustParseAddr("192.168.79.200")
	vip6 = netip.MustParseAddr("fd79::200")
)

// node is one node's whole LAN Service side, in its own namespace.
type node struct {
	name string
	*testenv.LANHost
	m *members.Members
	a *announce.Announcer
	s *speaker.Speaker
}

// cluster is nodes and a client on one LAN.
type cluster struct {
	t      testing.TB
	lan    *testenv.LAN
	nodes  []*node
	client *testenv.LANHost
}

func newCluster(t testing.TB, n int) *cluster {
	c := &cluster{t: t, lan: testenv.NewLAN(t)}
	var peers []string
	for i := 1; i <= n; i++ {
		peers = append(peers, fmt.Sprintf("192.168.79.%d", 10+i))
	}
	for i := 1; i <= n; i++ {
		nd := &node{name: fmt.Sprintf("node-%d", i)}
		nd.LANHost = c.lan.Host("eth0", peers[i-1]+"/24", fmt.Sprintf("fd79::%d/64", 10+i))
		var sp atomic.Pointer[speaker.Speaker]
		if err := testenv.InNS(nd.NS, func() (err error) {
			if nd.a, err = announce.New(announce.Config{Interface: "eth0"}); err != nil {
				return err
			}
			nd.m, err = members.Start(members.Config{
				Name: nd.name, Addr: netip.MustParseAddr(peers[i-1]), Peers: peers,
				Dial: testenv.DialerIn(nd.NS),
				OnChange: func() {
					if s := sp.Load(); s != nil {
						s.Kick()
					}
				},
			})
			if err != nil {
				return err
			}
			nd.s, err = speaker.New(speaker.Config{Node: nd.name, Interface: "eth0", Announcer: nd.a, Members: nd.m})
			sp.Store(nd.s)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = nd.s.Close()
			_ = nd.m.Close()
			_ = nd.a.Close()
		})
		c.nodes = append(c.nodes, nd)
	}
	c.client = c.lan.Host("eth0", "192.168.79.100/24", "fd79::100/64")
	return c
}

func (c *cluster) names() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.name)
	}
	return out
}

func (c *cluster) byName(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}

func (c *cluster) want(addrs ...netip.Addr) {
	var w []elect.Want
	for _, a := range addrs {
		w = append(w, elect.Want{Addr: a, Eligible: c.names()})
	}
	for _, n := range c.nodes {
		n.s.SetWants(w)
	}
}

// owner is the node that should answer for a when the nodes in up are
// the live ones.
func (c *cluster) owner(a netip.Addr, up ...string) *node {
	return c.byName(elect.Owner(a, c.names(), func(n string) bool { return slices.Contains(up, n) }))
}

// state describes every node's view, for failure messages.
func (c *cluster) state() string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "%s (%s): live %v settled %v holds %v; ", n.name, n.MAC, n.m.Live(), n.m.Settled(), n.a.Held())
	}
	return b.String()
}

// answeredBy waits until an ARP question for a from the client is
// answered by exactly want's MAC, and returns how long that took.
func (c *cluster) answeredBy(a netip.Addr, want *node) time.Duration {
	c.t.Helper()
	return testenv.WaitFor(c.t, fmt.Sprintf("%s answered by %s (%s) alone", a, want.name, want.MAC), func() error {
		got, err := testenv.ARPAnswers(c.client.NS, "eth0", a, 100*time.Millisecond)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != want.MAC.String() {
			return fmt.Errorf("answers %v; %s", got, c.state())
		}
		return nil
	})
}

// neighbourMoves waits until the client's kernel has want's MAC for a
// (for IPv6: the unsolicited advertisement, or a fresh resolution).
func (c *cluster) neighbourMoves(a netip.Addr, want *node) {
	c.t.Helper()
	testenv.WaitFor(c.t, fmt.Sprintf("client resolves %s to %s", a, want.name), func() error {
		_ = testenv.Ping(c.client.NS, a.String(), 1)
		out, _ := testenv.IP(c.client.NS, "neigh", "show", a.String(), "dev", "eth0")
		if !slices.Contains(strings.Fields(out), want.MAC.String()) {
			return fmt.Errorf("entry %q", out)
		}
		return nil
	})
}

// watchSplitBrain samples every node's held addresses until stop is
// called and reports any moment two nodes held one address.
func (c *cluster) watchSplitBrain() (stop func() []string) {
	done := make(chan struct{})
	var mu sync.Mutex
	var found []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			holders := map[netip.Addr][]string{}
			for _, n := range c.nodes {
				for _, a := range n.a.Held() {
					holders[a] = append(holders[a], n.name)
				}
			}
			for a, h := range holders {
				if len(h) > 1 {
					mu.Lock()
					found = append(found, fmt.Sprintf("%s held by %v", a, h))
					mu.Unlock()
				}
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() []string {
		close(done)
		wg.Wait()
		return found
	}
}

// TestFailoverAndReturn: exactly one node answers for each address; when
// it drops off the LAN another takes over and the client's neighbour
// entries follow; when it returns, it takes the address back and at no
// moment do two nodes on the LAN answer.
func TestFailoverAndReturn(t *testing.T) {
	c := newCluster(t, 3)
	c.want(vip4, vip6)
	all := c.names()
	first := c.owner(vip4, all...)
	c.answeredBy(vip4, first)
	c.neighbourMoves(vip4, first)
	c.neighbourMoves(vip6, c.owner(vip6, all...))

	for round := range 2 {
		gone := c.owner(vip4, all...)
		var rest []string
		for _, n := range all {
			if n != gone.name {
				rest = append(rest, n)
			}
		}
		next := c.owner(vip4, rest...)
		c.lan.Unplug(gone.LANHost)
		d := c.answeredBy(vip4, next)
		t.Logf("round %d: %s off the LAN; %s answered for %s after %v", round, gone.name, next.name, vip4, d.Round(time.Millisecond))
		c.neighbourMoves(vip4, next)
		c.neighbourMoves(vip6, c.owner(vip6, rest...))
		testenv.WaitFor(t, gone.name+" answers for nothing while off the LAN", func() error {
			if h := gone.a.Held(); len(h) > 0 {
				return fmt.Errorf("holds %v", h)
			}
			return nil
		})

		// Off the LAN it holds nothing (above), so any two holders from
		// here on would answer side by side.
		stop := c.watchSplitBrain()
		c.lan.Plug(gone.LANHost)
		d = c.answeredBy(vip4, gone)
		t.Logf("round %d: %s back; it answers alone for %s after %v", round, gone.name, vip4, d.Round(time.Millisecond))
		c.neighbourMoves(vip6, c.owner(vip6, all...))
		if split := stop(); len(split) > 0 {
			sort.Strings(split)
			t.Fatalf("split brain after %s came back: %v", gone.name, slices.Compact(split))
		}
	}

	t.Run("QuickReturn", func(t *testing.T) {
		// The owner is back as soon as another node answers: it may not
		// even have been declared dead by everyone yet. It must still
		// never answer beside the node that took over.
		stop := c.watchSplitBrain()
		gone := c.owner(vip4, all...)
		var rest []string
		for _, n := range all {
			if n != gone.name {
				rest = append(rest, n)
			}
		}
		c.lan.Unplug(gone.LANHost)
		c.answeredBy(vip4, c.owner(vip4, rest...))
		c.lan.Plug(gone.LANHost)
		c.answeredBy(vip4, gone)
		if split := stop(); len(split) > 0 {
			t.Fatalf("split brain around a quick return of %s: %v", gone.name, split)
		}
	})
	t.Run("Released", func(t *testing.T) {
		c.want()
		testenv.WaitFor(t, "no answer for a released address", func() error {
			got, err := testenv.ARPAnswers(c.client.NS, "eth0", vip4, 200*time.Millisecond)
			if err != nil || len(got) > 0 {
				return fmt.Errorf("answers %v (%v)", got, err)
			}
			return nil
		})
	})
}

// TestTwoNodes: the smallest cluster with failover. When the node that
// answers drops off the LAN, the other is left with no live peer: it takes
// over and keeps answering for as long as it is alone (it must not take
// an empty view for its own isolation). Its own LAN link flapping
// meanwhile makes it wait for a peer again; with none answering it
// settles alone (members.DefaultAlone) and answers again.
func TestTwoNodes(t *testing.T) {
	c := newCluster(t, 2)
	c.want(vip4)
	all := c.names()
	gone := c.owner(vip4, all...)
	c.answeredBy(vip4, gone)
	var left *node
	for _, n := range c.nodes {
		if n != gone {
			left = n
		}
	}
	c.lan.Unplug(gone.LANHost)
	d := c.answeredBy(vip4, left)
	t.Logf("%s off the LAN; %s, now alone, answered after %v", gone.name, left.name, d.Round(time.Millisecond))
	// Alone for several rejoin periods (and past DefaultAlone), it holds
	// the address the whole time.
	for end := time.Now().Add(members.DefaultAlone + 4*members.DefaultRejoin); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if !slices.Contains(left.a.Held(), vip4) {
			t.Fatalf("%s, alone, stopped answering for %s: %s", left.name, vip4, c.state())
		}
	}
	// Its own link flaps: it waits for a peer, none answers, it settles
	// alone and answers again.
	c.lan.Unplug(left.LANHost)
	testenv.WaitFor(t, left.name+" answers for nothing while off the LAN", func() error {
		if h := left.a.Held(); len(h) > 0 {
			return fmt.Errorf("holds %v", h)
		}
		return nil
	})
	c.lan.Plug(left.LANHost)
	d = c.answeredBy(vip4, left)
	t.Logf("%s back on the LAN with no peer: answered again after %v", left.name, d.Round(time.Millisecond))
	// The other comes back: one of them answers, never both.
	stop := c.watchSplitBrain()
	c.lan.Plug(gone.LANHost)
	c.answeredBy(vip4, c.owner(vip4, all...))
	if split := stop(); len(split) > 0 {
		t.Fatalf("split brain after %s came back: %v", gone.name, split)
	}
}
