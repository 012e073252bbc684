package drops

import (
	"slices"
	"strings"
	"sync"

	"github.com/village-cni/village/pkg/netpol/table"
)

// Label is what village_policy_drops_total counts by: the direction, the
// dropping pod's namespace, and the names of the policies that isolate it
// in that direction, sorted and joined with "," ("" when the last
// compile did not say).
type Label struct {
	Direction, Namespace, Policy string
}

// Totals turns the per-pod chains' drop counters into counts by Label
// that never go down: a chain that goes (its pod gone, its policies
// gone) leaves its count in its Label's total, a pod whose policies
// change counts under its new Label from the last read on, and a counter
// that went back (a table written anew without its counts) starts again.
type Totals struct {
	mu      sync.Mutex
	chains  map[string]chainTotal
	retired map[Label]uint64
}

type chainTotal struct {
	label      Label
	base, last uint64
}

// NewTotals starts from no count.
func NewTotals() *Totals {
	return &Totals{chains: map[string]chainTotal{}, retired: map[Label]uint64{}}
}

// Observe takes the counters read now (table.Drops) with the names of the
// controller's last model, and returns the totals by Label.
func (t *Totals) Observe(drops []table.ChainDrops, names *Names) map[Label]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[string]bool{}
	for _, d := range drops {
		seen[d.Chain] = true
		l := labelOf(d, names)
		ct, ok := t.chains[d.Chain]
		switch {
		case !ok:
			ct = chainTotal{label: l, last: d.Packets}
		case d.Packets < ct.last:
			t.retired[ct.label] += ct.last - ct.base
			ct = chainTotal{label: l, last: d.Packets}
		case l != ct.label:
			t.retired[ct.label] += ct.last - ct.base
			ct = chainTotal{label: l, base: ct.last, last: d.Packets}
		default:
			ct.last = d.Packets
		}
		t.chains[d.Chain] = ct
	}
	for name, ct := range t.chains {
		if !seen[name] {
			t.retired[ct.label] += ct.last - ct.base
			delete(t.chains, name)
		}
	}
	out := make(map[Label]uint64, len(t.retired)+len(t.chains))
	for l, n := range t.retired {
		out[l] += n
	}
	for _, ct := range t.chains {
		out[ct.label] += ct.last - ct.base
	}
	return out
}

func labelOf(d table.ChainDrops, names *Names) Label {
	pod := d.Key
	if pod == "" {
		pod = names.PodOfChain(d.Chain)
	}
	ns, _, _ := strings.Cut(pod, "/")
	var pols []string
	for _, p := range names.Isolating(pod, d.Direction) {
		_, name, _ := strings.Cut(p, "/")
		pols = append(pols, name)
	}
	slices.Sort(pols)
	return Label{Direction: d.Direction, Namespace: ns, Policy: strings.Join(pols, ",")}
}
