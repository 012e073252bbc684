package agent

import (
	"sync"
	"time"

	"github.com/village-cni/village/pkg/overlay"
)

// An etcd outage longer than the registry's TTL expires every node's
// lease, this node's included: etcd drops every record while no agent can
// reach it, and when it is back the agents see their peers' records
// deleted a moment before (or after) the peers register again. Taking
// those deletions at their word would remove the routes to every peer
// right after an outage that the pods rode through. So a peer's removal is
// doubted while this node's own lease is in doubt — not renewed for a TTL
// (etcd is away from this node too) or registered again after it was lost
// less than a TTL ago — and the peer's routes are held. A held peer that
// registers again is simply back; one that has not once the doubt is over
// (a TTL after this node's own return) is removed then.

// leaseWatch is what the keep-alive loop (keep) knows of this node's own
// registration, for the reconcile loop to read.
type leaseWatch struct {
	mu      sync.Mutex
	ttl     time.Duration
	renewed time.Time // the last successful registration or renewal
	back    time.Time // when the lease was found expired and registered again
	now     func() time.Time
}

func newLeaseWatch(ttl time.Duration) *leaseWatch {
	return &leaseWatch{ttl: ttl, renewed: time.Now(), now: time.Now}
}

// ok records a successful registration or renewal; lost says the lease
// had expired (this node was away from etcd for longer than the TTL).
func (w *leaseWatch) ok(lost bool) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.renewed = w.now()
	if lost {
		w.back = w.renewed
	}
}

// doubt reports whether the registry's word that a peer left is in doubt
// now (see the comment above). A nil watch (no etcd registry) never doubts.
func (w *leaseWatch) doubt() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	return now.Sub(w.renewed) > w.ttl || (!w.back.IsZero() && now.Sub(w.back) < w.ttl)
}

// holdRemovals keeps the peers that change removes in the view while their
// removal is in doubt, and returns change without them; a peer the
// registry puts back is no longer held.
func (a *agent) holdRemovals(change overlay.PeerChange, put []string) overlay.PeerChange {
	for _, name := range put {
		delete(a.held, name)
	}
	if !a.lease.doubt() {
		for _, p := range change.Removed {
			delete(a.held, p.Name)
		}
		return change
	}
	for _, p := range change.Removed {
		a.view[p.Name] = p
		a.held[p.Name] = p
		a.opts.logf("peer %s's record is gone, but this node's own lease lapsed too (etcd away or just back): its routes stay until it registers again or the registry has been back for a TTL", p.Name)
	}
	change.Removed = nil
	return change
}

// releaseHeld removes the held peers that have not registered again once
// the doubt is over, and reports whether it removed any.
func (a *agent) releaseHeld() bool {
	if len(a.held) == 0 || a.lease.doubt() {
		return false
	}
	for name := range a.held {
		delete(a.view, name)
		a.opts.logf("peer %s left: its record did not come back after the registry returned", name)
	}
	clear(a.held)
	return true
}
