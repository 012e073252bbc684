package table

import (
	"net/netip"
	"slices"
	"sync"
)

// Marks is what the network's pending sets hold, followed from the
// kernel's notifications of their elements (the agent hands them over
// from pkg/nftwatch): ADD's marks come in, the controller's unmarking
// takes them out. A table deleted whole announces none of its elements,
// so after a firewall reload or `nft flush ruleset` Marks still holds the
// marks the kernel lost, and the repair of the pending table writes them
// back with it (EnsurePending): a pod marked pending and not compiled
// yet stays unreachable through the reload. Safe for concurrent use.
type Marks struct {
	network string
	mu      sync.Mutex
	addrs   map[netip.Addr]bool
}

// NewMarks returns an empty Marks of network's pending sets; Reset reads
// them.
func NewMarks(network string) *Marks {
	return &Marks{network: network, addrs: map[netip.Addr]bool{}}
}

// Sets are the pending sets' names, for the notifications' followers.
func (m *Marks) Sets() (table string, sets []string) {
	_, s := pendingSets(m.network)
	return PendingTable(m.network), []string{s[0].Name, s[1].Name}
}

// Update adds (or, deleted, removes) the addresses of one notification's
// element keys.
func (m *Marks) Update(keys [][]byte, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		a, ok := netip.AddrFromSlice(k)
		if !ok {
			continue
		}
		if deleted {
			delete(m.addrs, a)
		} else {
			m.addrs[a] = true
		}
	}
}

// Reset reads the pending sets from the kernel (of the calling thread's
// network namespace) after notifications may have been missed. A table
// that is not there leaves Marks as it was: its marks are what a repair
// has to write back.
func (m *Marks) Reset() error {
	have, there, err := pending(m.network)
	if err != nil || !there {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.addrs)
	for _, a := range have {
		m.addrs[a] = true
	}
	return nil
}

// Addrs is what the sets held as last seen, sorted.
func (m *Marks) Addrs() []netip.Addr {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]netip.Addr, 0, len(m.addrs))
	for a := range m.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
