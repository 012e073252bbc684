package agent

import (
	"fmt"
	"os"
	"sync"

	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/metrics"
)

// health is what /readyz reports (why this node cannot network pods yet, nil
// when it can): the agent writes it, the HTTP server reads it, so it is the
// one piece of agent state behind a lock. It starts as "no pod subnet yet"
// and becomes the last reconcile's outcome once the loop runs.
type health struct {
	mu  sync.Mutex
	err error
}

func newHealth(node string) *health {
	return &health{err: fmt.Errorf("node %s holds no pod subnet yet", node)}
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
// serves, so its goroutines (the start's retries, then the loop) run; a
// node that waits for its subnet or a failing reconcile is not a reason to
// restart it. Readiness: this node can network pods: the subnet is held,
// the loop's last reconcile succeeded and the conflist is in place.
func (a *agent) probes() metrics.Probes {
	return metrics.Probes{
		Live: func() error { return nil },
		Ready: func() error {
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
