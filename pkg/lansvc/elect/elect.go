// Package elect decides which node answers for each LAN Service address.
//
// Every agent runs the same pure function over the same inputs: the
// addresses, the nodes eligible for each (for externalTrafficPolicy Local,
// the nodes with a ready local endpoint; for Cluster, every Ready node on
// the LAN that is not excluded from external load balancers), and the set
// of agents it sees alive on the LAN. The owner of an address is the
// eligible live node with the highest rendezvous score for it (a hash of
// node name and address), so:
//
//   - no coordination is needed to agree: agents that see the same
//     members pick the same owner, with the API server out of the path;
//   - the addresses spread over the nodes, and a node's departure moves
//     only the addresses it owned; its return moves back only those;
//   - ties cannot happen between distinct names except through a hash
//     collision, which the name breaks.
//
// Agents that disagree on liveness for a moment (a departure not yet seen
// by all) may both claim an address; the membership layer bounds that
// moment, and a node that (re)joins waits for the members' view before it
// claims anything (see pkg/lansvc/members).
package elect

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"slices"
)

// Score is the rendezvous score of node for addr.
func Score(node string, addr netip.Addr) uint64 {
	h := sha256.New()
	h.Write([]byte(node))
	h.Write([]byte{0})
	b, _ := addr.MarshalBinary()
	h.Write(b)
	return binary.BigEndian.Uint64(h.Sum(nil)[:8])
}

// Owner is the node, among eligible, that live reports alive and that has
// the highest score for addr; "" when none is both.
func Owner(addr netip.Addr, eligible []string, live func(node string) bool) string {
	best, bestScore := "", uint64(0)
	for _, n := range eligible {
		if n == "" || !live(n) {
			continue
		}
		s := Score(n, addr)
		if best == "" || s > bestScore || (s == bestScore && n < best) {
			best, bestScore = n, s
		}
	}
	return best
}

// Want is one address and the nodes that may answer for it. Services
// that share an address (village.cni.io/lan-share) are one Want, with the
// nodes eligible for all of them: the caller merges them.
type Want struct {
	Addr     netip.Addr
	Eligible []string
}

// Mine lists, sorted and without repeats, the addresses among wants that
// self owns when live says who is alive.
func Mine(self string, wants []Want, live func(node string) bool) []netip.Addr {
	var out []netip.Addr
	for _, w := range wants {
		if Owner(w.Addr, w.Eligible, live) == self {
			out = append(out, w.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Writer is the node, among nodes, with the highest rendezvous score for
// key (a Service or share group): the one agent that allocates its
// address and writes its status, so the agents split the Services
// between them without talking. "" when nodes is empty.
func Writer(key string, nodes []string) string {
	best, bestScore := "", uint64(0)
	for _, n := range nodes {
		h := sha256.New()
		h.Write([]byte(n))
		h.Write([]byte{1}) // not an address's score
		h.Write([]byte(key))
		s := binary.BigEndian.Uint64(h.Sum(nil)[:8])
		if best == "" || s > bestScore || (s == bestScore && n < best) {
			best, bestScore = n, s
		}
	}
	return best
}
