package announce_test

import (
	"fmt"
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
			// The foreign host takes the address (no DAD: a host that
			// does not check) and uses it as its source towards the
			// client, so it asks for the client from it, again and again.
			bits := 24
			if ip.Is6() {
				bits = 64
			}
			add := []string{"addr", "add", fmt.Sprintf("%s/%d", ip, bits), "dev", "eth0"}
			if ip.Is6() {
				add = append(add, "nodad")
			}
			testenv.MustIP(t, foreign.NS, add...)
			clientIP := "192.168.77.100"
			if ip.Is6() {
				clientIP = "fd77::100"
			}
			testenv.WaitFor(t, "the node yields "+ip.String(), func() error {
				testenv.MustIP(t, foreign.NS, "neigh", "flush", "dev", "eth0")
				_ = exec.Command("ip", "netns", "exec", filepath.Base(foreign.NS.Path()), "ping", "-c", "1", "-W", "1", "-I", ip.String(), clientIP).Run()
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
