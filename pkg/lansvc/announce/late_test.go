package announce

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
)

// TestProbeHeardWhenTheWaitEndsLate: a node whose wait for answers to its
// probe ends late (a loaded machine: the deadline has passed by the time
// it looks, and the answer is in too) must leave the address to the host
// that answered, every time. Before, the wait was one select over "the
// deadline passed" and "an answer was heard", Go picked one of the two
// ready cases at random, and about one late wait in two took the address
// beside its holder. The test hook holds each wait until the answer is
// heard and the deadline has passed, twenty times.
func TestProbeHeardWhenTheWaitEndsLate(t *testing.T) {
	ip := netip.MustParseAddr("192.168.77.200")
	l := testenv.NewLAN(t)
	node := l.Host("eth0", "192.168.77.11/24")
	foreign := l.Host("eth0", "192.168.77.50/24", ip.String()+"/24")
	var a *Announcer
	if err := testenv.InNS(node.NS, func() (err error) {
		// No rate limit within the test, and a retry soon after each
		// conflict.
		a, err = New(Config{Interface: "eth0", Conflict: ConflictTiming{MaxConflicts: 1000, RetryJitter: time.Millisecond}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	var waits atomic.Int32
	hookErr := make(chan error, 1)
	a.waitEnded = func(ip netip.Addr, deadline time.Time) {
		a.mu.Lock()
		h := a.held[ip]
		a.mu.Unlock()
		select {
		case <-h.foreign:
		case <-time.After(10 * time.Second):
			select {
			case hookErr <- fmt.Errorf("the foreign host's answer to probe %d was not heard within 10s", waits.Load()+1):
			default:
			}
		}
		<-time.After(time.Until(deadline) + time.Millisecond)
		waits.Add(1)
	}
	for waits.Load() < 20 {
		err := a.Set([]netip.Addr{ip})
		select {
		case err := <-hookErr:
			t.Fatal(err)
		default:
		}
		if a.Holds(ip) {
			t.Fatalf("after %d late waits the node took %s, which the foreign host answers for (Set: %v)", waits.Load(), ip, err)
		}
		if err != nil && !errors.Is(err, ErrContested) {
			t.Fatal(err)
		}
	}
	if got := a.InUseBy(ip); got.String() != foreign.MAC.String() {
		t.Fatalf("in use by %q, want the foreign host's %s", got, foreign.MAC)
	}
}
