package agent

import (
	"context"
	"sync"

	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nftwatch"
)

// nftWatch follows the node's nf_tables notifications (pkg/nftwatch) for
// the network's own tables, so one that a firewall reload or `nft flush
// ruleset` removed is put back within milliseconds rather than at the next
// tick:
//
//   - the masquerade tables (inet and bridge, masq.Table), and the nat
//     and filter tables where iptables-nft keeps the iptables backend's
//     rules: masq receives, and the masquerade keeper (masquerade.go)
//     runs masq.Keep; legacy iptables sends no notification, so on such a
//     host the loop's tick asks it for a pass too (masqOnTick);
//   - with networkPolicy on, the policy table (any change) and the pending
//     table (any change but its elements: ADD adds the marks, the
//     controller removes them): policy receives, the controller's Kick,
//     and the controller runs its repair (pkg/netpol/controller). The
//     pending sets' elements are followed too (table.Marks), so the
//     repair of a deleted pending table writes back the marks it held.
//
// Both repairs compare the kernel with what they want and write nothing
// when they are equal, so the notifications of the agent's own writes cost
// one read each and start nothing more. Each channel holds one signal, so
// a table flushed over and over costs one repair in flight and one queued.
type nftWatch struct {
	w      *nftwatch.Watcher
	masq   <-chan struct{}
	policy <-chan struct{} // nil without networkPolicy
	// marks follows the pending sets' elements (nil without
	// networkPolicy): the controller's repair writes them back with a
	// deleted pending table.
	marks *table.Marks
}

// The tables iptables-nft writes the iptables backend's rules to (in the
// ip and ip6 families; masq/iptables.go).
const (
	iptablesNAT    = "nat"
	iptablesFilter = "filter"
)

func (a *agent) newNftWatch() *nftWatch {
	name := a.c.Net.Name
	w := nftwatch.New(nftwatch.Options{Logf: a.opts.logf})
	n := &nftWatch{w: w, masq: w.Register(nftwatch.Tables(masq.Table(name), iptablesNAT, iptablesFilter))}
	if a.c.Net.NetworkPolicy {
		policy, pending := table.PolicyTable(name), table.PendingTable(name)
		n.policy = w.Register(func(c nftwatch.Change) bool {
			return c.Table == policy || (c.Table == pending && c.Object != nftwatch.Element)
		})
		n.marks = table.NewMarks(name)
		tb, sets := n.marks.Sets()
		w.FollowElements(tb, sets, n.marks.Update, func() {
			if err := n.marks.Reset(); err != nil {
				a.opts.logf("network policy: reading the pending marks: %v", err)
			}
		})
	}
	return n
}

// run follows the notifications in wg until ctx is done.
func (n *nftWatch) run(ctx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() { n.w.Run(ctx) })
}

// masqChanged is the masquerade tables' channel (nil, which never
// receives, without a watcher).
func (n *nftWatch) masqChanged() <-chan struct{} {
	if n == nil {
		return nil
	}
	return n.masq
}
