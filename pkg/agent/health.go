package agent

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/metrics"
)

// health is what /readyz reports (why this node cannot network pods yet, nil
// when it can) and what /healthz reports (whether the reconcile loop still
// makes progress): the agent writes it, the HTTP server reads it, so it is
// the one piece of agent state behind a lock. err starts as "no pod subnet
// yet" and becomes the last reconcile's outcome once the loop runs.
type health struct {
	mu  sync.Mutex
	err error
	// beat is when the loop last went round (zero: not started); bound is
	// how long it may take before liveness fails; now is the clock (a test
	// moves it instead of waiting).
	beat  time.Time
	bound time.Duration
	now   func() time.Time
}

func newHealth(node string) *health {
	return &health{err: fmt.Errorf("node %s holds no pod subnet yet", node), now: time.Now}
}

// liveBound is how long the loop may go without coming round before
// /healthz fails: six repair periods and four pass timeouts (3 min with the
// defaults). An idle loop comes round every period; a pass is bounded by
// passTimeout, but the masquerade repair and the reclaim pass of the same
// tick are not, hence the margin. Only a loop stuck for minutes (a hung
// netlink or netfilter call, a deadlock) fails it.
func liveBound(period time.Duration) time.Duration { return 6*period + 4*passTimeout }

// beatNow records that the loop went round; the first call starts the
// liveness check with bound.
func (h *health) beatNow(bound time.Duration) {
	h.mu.Lock()
	h.beat, h.bound = h.now(), bound
	h.mu.Unlock()
}

// alive is nil until the loop runs and while it came round within bound.
func (h *health) alive() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.beat.IsZero() {
		return nil
	}
	if idle := h.now().Sub(h.beat); idle > h.bound {
		return fmt.Errorf("the reconcile loop has not come round for %s (more than %s): stuck", idle.Round(time.Second), h.bound)
	}
	return nil
}

func (h *health) set(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

func (h *health) get() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// probes are the agent's answers to the kubelet. Liveness: the process
// serves and, once the loop runs, the loop came round within liveBound
// (its heartbeat); a node that waits for its subnet or a failing reconcile
// is not a reason to restart it, a stuck loop is. Readiness: this node can
// network pods: its API writes are proved confined (confine.go, when it
// uses the API), the subnet is held, the loop's last reconcile succeeded
// and the conflist is in place.
func (a *agent) probes() metrics.Probes {
	return metrics.Probes{
		Live: a.health.alive,
		Ready: func() error {
			if a.confine != nil {
				if err := a.confine.get(); err != nil {
					return err
				}
			}
			if err := a.health.get(); err != nil {
				return err
			}
			if _, err := os.Stat(a.confPath()); err != nil {
				return fmt.Errorf("conflist: %w", err)
			}
			return nil
		},
	}
}

// countAllocations reports the disk store's allocations per pod subnet. It
// only lists the network's directory (file names are addresses), taking no
// lock and opening no file, so it never slows an ADD.
func (a *agent) countAllocations() {
	if a.m == nil {
		return
	}
	held, err := disk.Peek(a.c.DataDir, a.c.Net.Name, false)
	if err != nil {
		return // the etcd store, or an unreadable directory: nothing to count here
	}
	counts := make(map[string]int, len(a.self.PodCIDRs))
	for _, cidr := range a.self.PodCIDRs {
		counts[cidr.String()] = 0
	}
	for _, r := range held {
		for _, cidr := range a.self.PodCIDRs {
			if cidr.Contains(r.IP.AsSlice()) {
				counts[cidr.String()]++
			}
		}
	}
	a.m.ResetAllocations()
	for pool, n := range counts {
		a.m.SetAllocations(a.c.Net.Name, pool, n)
	}
}
