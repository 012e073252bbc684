package agent

import (
	"testing"
	"time"

	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

// The lease watch doubts a peer's removal while this node's own lease has
// not been renewed for a TTL, and for a TTL after it was found lost and
// registered again; never otherwise, and never without an etcd registry.
func TestLeaseWatchDoubt(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		renewed time.Duration // after t0; -1: never renewed since the start at t0
		lost    bool          // that renewal found the lease expired
		again   time.Duration // after t0: a plain renewal after it (0: none)
		at      time.Duration
		want    bool
	}{
		{"renewed recently", 10 * time.Second, false, 0, 12 * time.Second, false},
		{"not renewed for less than a TTL", 0, false, 0, 4 * time.Second, false},
		{"not renewed for longer than a TTL", 0, false, 0, 6 * time.Second, true},
		{"just back after losing the lease", 60 * time.Second, true, 63 * time.Second, 64 * time.Second, true},
		{"back for longer than a TTL", 60 * time.Second, true, 63 * time.Second, 66 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			now := t0
			w := &leaseWatch{ttl: 5 * time.Second, renewed: t0, now: func() time.Time { return now }}
			now = t0.Add(c.renewed)
			w.ok(c.lost)
			if c.again != 0 {
				now = t0.Add(c.again)
				w.ok(false)
			}
			now = t0.Add(c.at)
			if got := w.doubt(); got != c.want {
				t.Fatalf("doubt = %v, want %v", got, c.want)
			}
		})
	}
	var none *leaseWatch
	none.ok(true)
	if none.doubt() {
		t.Fatal("a nil lease watch (no etcd registry) doubts")
	}
}

// Removals in doubt keep the peer in the view (no change to apply); the
// peer put back is no longer held; once the doubt is over, a held peer
// that never came back is removed.
func TestAgentHoldsRemovalsInDoubt(t *testing.T) {
	c, err := Load(Options{ConfFile: write(t, "c.conflist", registryList), NodeName: "self"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	w := &leaseWatch{ttl: 5 * time.Second, renewed: now.Add(-time.Minute), now: func() time.Time { return now }}
	a := &agent{n: &node{c: c}, c: c, view: peerMap(c.staticPeers()), held: map[string]overlay.Node{}, lease: w}
	rec := func(name, ip, cidr string) registry.Node {
		return registry.Node{Name: name, IP: ip, PodCIDRs: []string{cidr}}
	}
	a.lease = nil // before the outage: taken at its word
	a.setView(registry.Batch{Full: true, Nodes: []registry.Node{rec("a", "192.0.2.1", "10.1.1.0/24"), rec("b", "192.0.2.2", "10.1.2.0/24")}})
	a.lease = w // not renewed for a minute: etcd is away
	if ch := a.setView(registry.Batch{Removed: []string{"a", "b"}}); !ch.Empty() || len(a.view) != 2 || len(a.held) != 2 {
		t.Fatalf("removals in doubt: change %+v, view %v, held %v", ch, a.view, a.held)
	}
	if a.releaseHeld() {
		t.Fatal("held peers released while in doubt")
	}
	now = now.Add(time.Second)
	w.ok(true) // back: the lease had expired
	if ch := a.setView(registry.Batch{Nodes: []registry.Node{rec("a", "192.0.2.1", "10.1.1.0/24")}}); !ch.Empty() || len(a.held) != 1 {
		t.Fatalf("a registered again as it was: change %+v, held %v", ch, a.held)
	}
	now = now.Add(6 * time.Second)
	w.ok(false)
	if !a.releaseHeld() || len(a.held) != 0 || len(a.view) != 1 || a.view["a"].Name != "a" {
		t.Fatalf("after the doubt: view %v, held %v", a.view, a.held)
	}
	// Out of doubt, a removal is taken at its word.
	if ch := a.setView(registry.Batch{Removed: []string{"a"}}); len(ch.Removed) != 1 || len(a.view) != 0 {
		t.Fatalf("a removal out of doubt: change %+v, view %v", ch, a.view)
	}
}
