package agent

import (
	"fmt"
	"sync"

	"github.com/village-cni/village/pkg/ipam/store/disk"
)

// health is what /healthz reports: the loop writes it, the HTTP server
// reads it, so it is the one piece of agent state behind a lock.
type health struct {
	mu  sync.Mutex
	err error
}

func newHealth() *health { return &health{err: fmt.Errorf("starting")} }

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
