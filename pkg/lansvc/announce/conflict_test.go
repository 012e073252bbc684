package announce_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/lansvc/announce"
)

// timedAnnouncer opens an Announcer with the conflict timing t.
func timedAnnouncer(tb *testing.T, h *testenv.LANHost, t announce.ConflictTiming) *announce.Announcer {
	tb.Helper()
	var a *announce.Announcer
	if err := testenv.InNS(h.NS, func() (err error) {
		a, err = announce.New(announce.Config{Interface: "eth0", Conflict: t})
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = a.Close() })
	return a
}

// keepSetting calls a.Set(addrs) every 20 ms, as the speaker's retries
// do, until the test ends.
func keepSetting(t *testing.T, a *announce.Announcer, addrs []netip.Addr) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			_ = a.Set(addrs)
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait(); _ = a.Set(nil) })
}

// answers asks once from client who has ip and returns the MACs that
// answered.
func answers(t *testing.T, client *testenv.LANHost, ip netip.Addr) []string {
	t.Helper()
	ask := testenv.ARPAnswers
	if ip.Is6() {
		ask = testenv.NDPAnswers
	}
	macs, err := ask(client.NS, "eth0", ip, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return macs
}

// kernelTakes puts ip on h's eth0 (no DAD: a host that does not check),
// so h's kernel answers for it and may send from it; it returns the
// prefix it added.
func kernelTakes(t *testing.T, h *testenv.LANHost, ip netip.Addr) string {
	t.Helper()
	prefix := ip.String() + "/24"
	add := []string{"addr", "add", prefix, "dev", "eth0"}
	if ip.Is6() {
		prefix = ip.String() + "/64"
		add = []string{"addr", "add", prefix, "dev", "eth0", "nodad"}
	}
	testenv.MustIP(t, h.NS, add...)
	return prefix
}

// claimFrom makes h, which holds ip (kernelTakes), use it as its source
// towards the client (host 100) once, with its neighbour cache flushed:
// h asks for the client from ip, which is a claim on ip.
func claimFrom(t *testing.T, h *testenv.LANHost, ip netip.Addr) {
	t.Helper()
	clientIP := "192.168.77.100"
	if ip.Is6() {
		clientIP = "fd77::100"
	}
	testenv.MustIP(t, h.NS, "neigh", "flush", "dev", "eth0")
	_ = exec.Command("ip", "netns", "exec", filepath.Base(h.NS.Path()), "ping", "-c", "1", "-W", "1", "-I", ip.String(), clientIP).Run()
}

// TestForeignHostTakesTheAddressLater: a LAN host (the kernel of a
// namespace, the address added to its interface) starts using an address
// the node holds. The node defends it once, and when the host claims it
// again, yields: it stops answering, reports the address contested with
// the host's MAC, and the host's MAC alone answers.
func TestForeignHostTakesTheAddressLater(t *testing.T) {
	for _, ip := range []netip.Addr{vip4, vip6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[ip.Is4()], func(t *testing.T) {
			l := testenv.NewLAN(t)
			node := host(l, 11)
			foreign := host(l, 50)
			client := host(l, 100)
			a := timedAnnouncer(t, node, announce.ConflictTiming{RetryJitter: 50 * time.Millisecond})
			if err := a.Set([]netip.Addr{ip}); err != nil {
				t.Fatal(err)
			}
			if got := answers(t, client, ip); len(got) != 1 || got[0] != node.MAC.String() {
				t.Fatalf("answers for %s before the foreign host: %v, want [%s]", ip, got, node.MAC)
			}
			// Later: the node's takeover burst is over.
			burstDone(t, a)
			// The foreign host takes the address (no DAD: a host that
			// does not check) and uses it as its source towards the
			// client, so it asks for the client from it, again and again.
			kernelTakes(t, foreign, ip)
			testenv.WaitFor(t, "the node yields "+ip.String(), func() error {
				claimFrom(t, foreign, ip)
				if len(a.Held()) != 0 {
					return fmt.Errorf("still holds %v", a.Held())
				}
				return nil
			})
			if got := a.InUseBy(ip); got.String() != foreign.MAC.String() {
				t.Errorf("InUseBy(%s) = %s, want the foreign host's %s", ip, got, foreign.MAC)
			}
			if c := a.Contested(); len(c) != 1 || c[0].Addr != ip || c[0].MACText != foreign.MAC.String() {
				t.Errorf("Contested() = %+v", c)
			}
			if cs := a.Counters(); cs.Defended == 0 || cs.Yielded != 1 {
				t.Errorf("counters: %+v, want a defence and one yield", cs)
			}
			// The node keeps asking (the speaker retries); the foreign
			// host answers its probes, so it never takes the address back.
			keepSetting(t, a, []netip.Addr{ip})
			for range 3 {
				if got := answers(t, client, ip); len(got) != 1 || got[0] != foreign.MAC.String() {
					t.Fatalf("answers for %s after the node yielded: %v, want only the foreign host's [%s]", ip, got, foreign.MAC)
				}
			}
			if len(a.Held()) != 0 {
				t.Fatalf("the node took %s back from its holder", ip)
			}
		})
	}
}

// TestProbeAgainstProbe: two nodes that probe for the same address at the
// same moment, and keep trying, end with one of them answering: each
// sees the other's probe (from 0.0.0.0, or from :: in DAD) as a conflict,
// backs off for a random delay, and the first to probe again takes it;
// the other is then answered and reports it contested.
func TestProbeAgainstProbe(t *testing.T) {
	for _, ip := range []netip.Addr{vip4, vip6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[ip.Is4()], func(t *testing.T) {
			l := testenv.NewLAN(t)
			n1, n2 := host(l, 11), host(l, 12)
			client := host(l, 100)
			timing := announce.ConflictTiming{RetryJitter: 300 * time.Millisecond}
			a1, a2 := timedAnnouncer(t, n1, timing), timedAnnouncer(t, n2, timing)
			c := testenv.StartCapture(t, client.NS, "eth0", "arp or icmp6")
			start := make(chan struct{})
			var wg sync.WaitGroup
			for _, a := range []*announce.Announcer{a1, a2} {
				wg.Go(func() { <-start; _ = a.Set([]netip.Addr{ip}) })
			}
			close(start)
			wg.Wait()
			keepSetting(t, a1, []netip.Addr{ip})
			keepSetting(t, a2, []netip.Addr{ip})
			var winner, loser *announce.Announcer
			testenv.WaitFor(t, "one node holds "+ip.String(), func() error {
				h1, h2 := len(a1.Held()) == 1, len(a2.Held()) == 1
				switch {
				case h1 && !h2:
					winner, loser = a1, a2
				case h2 && !h1:
					winner, loser = a2, a1
				default:
					return fmt.Errorf("n1 holds %v, n2 holds %v", a1.Held(), a2.Held())
				}
				if loser.InUseBy(ip).String() != winner.HardwareAddr().String() {
					return fmt.Errorf("the loser reports %s in use by %q", ip, loser.InUseBy(ip))
				}
				return nil
			})
			for range 3 {
				if got := answers(t, client, ip); len(got) != 1 || got[0] != winner.HardwareAddr().String() {
					t.Fatalf("answers for %s: %v, want exactly the winner's [%s]", ip, got, winner.HardwareAddr())
				}
			}
			if len(loser.Held()) != 0 {
				t.Fatalf("the loser took %s too", ip)
			}
			out := c.Stop()
			probe := "who-has " + ip.String() + " tell 0.0.0.0"
			if ip.Is6() {
				probe = ":: > ff02::1:ff00:200: ICMP6, neighbor solicitation, who has " + ip.String()
			}
			if !strings.Contains(out, probe) {
				t.Errorf("no probe from the unspecified address (%q) captured:\n%s", probe, out)
			}
		})
	}
}

// TestContestedAddressBacksOff: an address a foreign host holds is probed
// again at first after a short random delay, and after MaxConflicts at
// most once per RateLimitInterval, however often the speaker asks.
// Counted from the probes captured on the LAN: an upper bound only, which
// a slow machine cannot break.
func TestContestedAddressBacksOff(t *testing.T) {
	l := testenv.NewLAN(t)
	node := host(l, 11)
	foreign := host(l, 50)
	testenv.MustIP(t, foreign.NS, "addr", "add", vip4.String()+"/24", "dev", "eth0")
	timing := announce.ConflictTiming{MaxConflicts: 3, RateLimitInterval: 2 * time.Second, RetryJitter: 10 * time.Millisecond}
	a := timedAnnouncer(t, node, timing)
	c := testenv.StartCapture(t, foreign.NS, "eth0", "arp and ether src "+node.MAC.String())
	begin := time.Now()
	keepSetting(t, a, []netip.Addr{vip4})
	testenv.WaitFor(t, "the node rate-limited", func() error {
		if cs := a.Contested(); len(cs) != 1 || cs[0].Conflicts < timing.MaxConflicts {
			return fmt.Errorf("contested: %+v", cs)
		}
		return nil
	})
	// Watch for two rate-limit intervals more while the speaker asks
	// every 20 ms.
	testenv.WaitFor(t, "two rate-limit intervals", func() error {
		if d := time.Since(begin); d < 3*timing.RateLimitInterval {
			return fmt.Errorf("%v so far", d)
		}
		return nil
	})
	out := c.Stop()
	window := time.Since(begin)
	probes := strings.Count(out, "who-has "+vip4.String()+" tell 0.0.0.0")
	// Two probes per attempt: MaxConflicts attempts, then one per
	// interval (and one more for the window's edges).
	limit := 2 * (timing.MaxConflicts + int(window/timing.RateLimitInterval) + 1)
	if probes == 0 || probes > limit {
		t.Fatalf("%d probes in %v, want 1 to %d:\n%s", probes, window, limit, out)
	}
	if len(a.Held()) != 0 {
		t.Fatal("took the foreign host's address")
	}
	t.Logf("%d probes in %v (limit %d)", probes, window, limit)
}

// burstDone waits until a, which took one address with the default
// burst, has sent every round of it: a claim now is no longer one heard
// while taking the address.
func burstDone(t *testing.T, a *announce.Announcer) {
	t.Helper()
	testenv.WaitFor(t, "the takeover burst ends", func() error {
		cs := a.Counters()
		if sent := cs.Gratuitous/2 + cs.Unsolicited; sent < uint64(len(announce.DefaultBurst)) {
			return fmt.Errorf("%d of %d rounds sent", sent, len(announce.DefaultBurst))
		}
		return nil
	})
}

// configured opens an Announcer on h's eth0 with cfg (its Interface set
// here).
func configured(tb *testing.T, h *testenv.LANHost, cfg announce.Config) *announce.Announcer {
	tb.Helper()
	cfg.Interface = "eth0"
	var a *announce.Announcer
	if err := testenv.InNS(h.NS, func() (err error) {
		a, err = announce.New(cfg)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = a.Close() })
	return a
}

func family(ip netip.Addr) string { return map[bool]string{true: "IPv4", false: "IPv6"}[ip.Is4()] }

// TestHandBackIsNoConflict: a node elected for an address that a peer
// node (its MAC published on its Node, SetPeers) still answers for, as
// after a failover when the first node returns, is told to ask again
// (ErrHandBack), however often it asks: more often than MaxConflicts,
// which would rate-limit a foreign host's address for RateLimitInterval.
// Nothing is recorded contested, and once the peer lets go the node takes
// the address at its next asking and answers alone. With the peer rule off
// (no SetPeers) the peer's answers are conflicts, the node is
// rate-limited, and this fails.
func TestHandBackIsNoConflict(t *testing.T) {
	for _, ip := range []netip.Addr{vip4, vip6} {
		t.Run(family(ip), func(t *testing.T) {
			l := testenv.NewLAN(t)
			n1, n2 := host(l, 11), host(l, 12)
			client := host(l, 100)
			// The default conflict timing (MaxConflicts 10, a 60 s rate
			// limit); a long probe wait, so that a loaded machine still
			// hears the peer's answer within it.
			a1 := configured(t, n1, announce.Config{ProbeWait: time.Second})
			a2 := configured(t, n2, announce.Config{ProbeWait: time.Second})
			a1.SetPeers([]net.HardwareAddr{n2.MAC})
			if err := a1.Set([]netip.Addr{ip}); err != nil {
				t.Fatal(err)
			}
			// Before n1's Node has published its MAC, n1 is another
			// host; once it has, what was recorded against it goes.
			if err := a2.Set([]netip.Addr{ip}); !errors.Is(err, announce.ErrContested) {
				t.Fatalf("asking for %s before the peer's MAC is known: %v, want ErrContested", ip, err)
			}
			a2.SetPeers([]net.HardwareAddr{n1.MAC})
			if c := a2.Contested(); len(c) != 0 {
				t.Fatalf("conflicts with a MAC that is now a peer's are kept: %+v", c)
			}
			tries := announce.DefaultConflictTiming.MaxConflicts + 3
			for i := range tries {
				err := a2.Set([]netip.Addr{ip})
				if !errors.Is(err, announce.ErrHandBack) || errors.Is(err, announce.ErrContested) {
					t.Fatalf("asking for %s while the peer holds it, try %d: %v, want only ErrHandBack", ip, i+1, err)
				}
			}
			if c := a2.Contested(); len(c) != 0 || a2.InUseBy(ip) != nil {
				t.Fatalf("a peer's answers recorded as a conflict: %+v, in use by %q", c, a2.InUseBy(ip))
			}
			if cs := a2.Counters(); cs.HandBacks < uint64(tries) || cs.Contested != 1 {
				t.Fatalf("counters %+v, want %d hand-backs and only the conflict from before the MAC was known", cs, tries)
			}
			// The election moves the address back: the peer lets go.
			if err := a1.Set(nil); err != nil {
				t.Fatal(err)
			}
			if err := a2.Set([]netip.Addr{ip}); err != nil {
				t.Fatalf("taking %s once the peer let go: %v", ip, err)
			}
			if got := answers(t, client, ip); len(got) != 1 || got[0] != n2.MAC.String() {
				t.Fatalf("answers for %s after the hand-back: %v, want only [%s]", ip, got, n2.MAC)
			}
		})
	}
}

// TestPeerClaimIsLeftToTheElection: a peer node that claims an address
// this node holds (it uses it as its sender, again and again, as during
// a hand-back whose two nodes both think themselves elected for a moment)
// is neither defended against nor yielded to: which node answers is the
// election's to say, through Set. A foreign host doing the same is
// defended against and then yielded to (TestForeignHostTakesTheAddressLater).
func TestPeerClaimIsLeftToTheElection(t *testing.T) {
	for _, ip := range []netip.Addr{vip4, vip6} {
		t.Run(family(ip), func(t *testing.T) {
			l := testenv.NewLAN(t)
			node, peer := host(l, 11), host(l, 12)
			client := host(l, 100)
			a := configured(t, node, announce.Config{Conflict: announce.ConflictTiming{DefendGrace: time.Millisecond}})
			a.SetPeers([]net.HardwareAddr{peer.MAC})
			if err := a.Set([]netip.Addr{ip}); err != nil {
				t.Fatal(err)
			}
			prefix := kernelTakes(t, peer, ip)
			testenv.WaitFor(t, "the node heard the peer claim "+ip.String()+" three times", func() error {
				claimFrom(t, peer, ip)
				cs := a.Counters()
				if cs.Defended != 0 || cs.Yielded != 0 {
					t.Fatalf("counters %+v: a peer's claim was defended against or yielded to", cs)
				}
				if cs.PeerClaims < 3 {
					return fmt.Errorf("counters %+v", cs)
				}
				return nil
			})
			if cs := a.Counters(); cs.Defended != 0 || cs.Yielded != 0 {
				t.Fatalf("counters %+v: a peer's claim was defended against or yielded to", cs)
			}
			if !a.Holds(ip) || len(a.Contested()) != 0 {
				t.Fatalf("holds %s: %v; contested %+v", ip, a.Holds(ip), a.Contested())
			}
			// The election picks the peer: the node lets go at once.
			testenv.MustIP(t, peer.NS, "addr", "del", prefix, "dev", "eth0")
			if err := a.Set(nil); err != nil {
				t.Fatal(err)
			}
			if got := answers(t, client, ip); len(got) != 0 {
				t.Fatalf("answers for %s after the node let go: %v", ip, got)
			}
		})
	}
}

// TestClaimWhileTakingLeavesTheAddress: a node that took an address while
// another host held it (its probe unanswered: here its LAN port was down
// while it probed, as a loaded node that hears the answer too late) and
// then hears the holder during its takeover burst leaves the address; the
// holder, whose defence is answered by the same burst's next frames, keeps
// it. Exactly one MAC answers, the holder's. Before this, the holder took
// the two frames of one burst round for two claims and yielded, and the
// newcomer kept the address.
func TestClaimWhileTakingLeavesTheAddress(t *testing.T) {
	for _, ip := range []netip.Addr{vip4, vip6} {
		t.Run(family(ip), func(t *testing.T) {
			l := testenv.NewLAN(t)
			holder, late := host(l, 11), host(l, 12)
			client := host(l, 100)
			ah := configured(t, holder, announce.Config{})
			// A burst long enough for the port to come back within it.
			al := configured(t, late, announce.Config{Burst: []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second}})
			if err := ah.Set([]netip.Addr{ip}); err != nil {
				t.Fatal(err)
			}
			// The holder's own takeover burst is over: it has held the
			// address for a while.
			burstDone(t, ah)
			l.Unplug(late)
			err := al.Set([]netip.Addr{ip})
			l.Plug(late)
			if err != nil || !al.Holds(ip) {
				t.Fatalf("the cut-off node did not take %s: %v", ip, err)
			}
			testenv.WaitFor(t, "the late node leaves "+ip.String(), func() error {
				if al.Holds(ip) {
					return fmt.Errorf("it still holds it; holder's counters %+v", ah.Counters())
				}
				return nil
			})
			if got := al.InUseBy(ip); got.String() != holder.MAC.String() {
				t.Errorf("the late node reports %s in use by %q, want the holder's %s", ip, got, holder.MAC)
			}
			if cs := ah.Counters(); !ah.Holds(ip) || cs.Yielded != 0 || cs.Defended == 0 {
				t.Fatalf("the holder holds %s: %v, counters %+v: want held, defended, never yielded", ip, ah.Holds(ip), cs)
			}
			for range 3 {
				if got := answers(t, client, ip); len(got) != 1 || got[0] != holder.MAC.String() {
					t.Fatalf("answers for %s: %v, want exactly the holder's [%s]", ip, got, holder.MAC)
				}
			}
		})
	}
}
