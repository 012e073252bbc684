package table

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// Update moves the policy table from old, the ruleset Apply or Update
// last installed, to rs in one transaction that touches only what
// differs: the elements a peer set gained or lost, the verdict-map entries
// of pods that came, went or changed address, the chains whose rules
// changed (flushed and refilled; their drop counters, objects of their
// own, kept: drops.go) and the chains and sets that appeared or went.
// The cost of a change thus follows the change, not the number of pods
// on the node. The table's fixed part (the forward chain, the four
// maps) is never touched; Apply remains the way to write the whole table
// (the first time, after an error, when the kernel drifted).
//
// A packet sees the old rules or the new ones, never a mix (one
// transaction), and the pending marks of the addresses rs compiled go in
// it, as with Apply. The pending table is left as it is (made if missing).
func Update(old, rs *Ruleset) error {
	if old == nil || old.Network != rs.Network || old.Bridge != rs.Bridge {
		return Apply(rs)
	}
	return install(rs, false, func(c *nftables.Conn) error { return queueChanges(c, old, rs) })
}

// Changes counts what Update would write for old to rs: set elements
// added and removed (an interval is one), map entries added and removed,
// chains added, refilled and removed, sets added and removed. Zero means
// the kernel needs nothing.
func Changes(old, rs *Ruleset) int {
	d := diff(old, rs)
	n := len(d.newSets) + len(d.goneSets) + len(d.newChains) + len(d.refill) + len(d.goneChains)
	for _, sd := range d.setElems {
		n += len(sd.add) + len(sd.del)
	}
	for _, md := range d.mapElems {
		n += len(md.add) + len(md.del)
	}
	return n
}

// chainKey names one chain: its kernel name, and the direction and pod it
// belongs to.
type chainKey struct {
	name string
	dir  direction
}

type rangeDiff struct{ add, del []Range }

type mapDiff struct{ add, del []mapEntry }

type mapEntry struct {
	ip    netip.Addr
	chain string
}

// delta is what differs between two rulesets.
type delta struct {
	newSets, goneSets []string
	setElems          map[string]rangeDiff // sets in both, by name
	// newChains are made and filled; refill are flushed and filled again;
	// goneChains are deleted (after their map entries).
	newChains, refill []chainKey
	goneChains        []string
	mapElems          map[string]mapDiff // by map name (ingress4, …)
}

// chains are the per-pod chains of rs by name.
func chains(rs *Ruleset) map[string]direction {
	out := map[string]direction{}
	for i := range rs.Pods {
		p := &rs.Pods[i]
		for _, d := range p.directions() {
			out[chainName(d.name[:2], p.Key)] = d
		}
	}
	return out
}

// entries are the verdict-map entries of rs, by map and address.
func entries(rs *Ruleset) map[string]map[netip.Addr]string {
	out := map[string]map[netip.Addr]string{"ingress4": {}, "ingress6": {}, "egress4": {}, "egress6": {}}
	for i := range rs.Pods {
		p := &rs.Pods[i]
		for _, d := range p.directions() {
			for _, ip := range p.IPs {
				out[mapName(d.name, ip)][ip] = chainName(d.name[:2], p.Key)
			}
		}
	}
	return out
}

func diff(old, rs *Ruleset) delta {
	d := delta{setElems: map[string]rangeDiff{}, mapElems: map[string]mapDiff{}}
	for _, name := range sortedKeys(rs.Sets) {
		was, ok := old.Sets[name]
		if !ok {
			d.newSets = append(d.newSets, name)
			continue
		}
		if rd := diffRanges(was.Ranges, rs.Sets[name].Ranges); len(rd.add)+len(rd.del) > 0 {
			d.setElems[name] = rd
		}
	}
	for _, name := range sortedKeys(old.Sets) {
		if _, ok := rs.Sets[name]; !ok {
			d.goneSets = append(d.goneSets, name)
		}
	}
	oldChains, newChains := chains(old), chains(rs)
	for _, name := range sortedKeys(newChains) {
		dir := newChains[name]
		was, ok := oldChains[name]
		switch {
		case !ok:
			d.newChains = append(d.newChains, chainKey{name, dir})
		case !slices.Equal(was.chain.Clauses, dir.chain.Clauses):
			d.refill = append(d.refill, chainKey{name, dir})
		}
	}
	for _, name := range sortedKeys(oldChains) {
		if _, ok := newChains[name]; !ok {
			d.goneChains = append(d.goneChains, name)
		}
	}
	oldMaps, newMaps := entries(old), entries(rs)
	for name, want := range newMaps {
		var md mapDiff
		for ip, ch := range oldMaps[name] {
			if want[ip] != ch {
				md.del = append(md.del, mapEntry{ip, ch})
			}
		}
		for ip, ch := range want {
			if oldMaps[name][ip] != ch {
				md.add = append(md.add, mapEntry{ip, ch})
			}
		}
		if len(md.add)+len(md.del) > 0 {
			d.mapElems[name] = md
		}
	}
	return d
}

// diffRanges: both lists are normalized (sorted, no two ranges touch), so
// a range of one is either in the other unchanged or not at all.
func diffRanges(was, now []Range) rangeDiff {
	in := func(rs []Range) map[Range]bool {
		m := make(map[Range]bool, len(rs))
		for _, r := range rs {
			m[r] = true
		}
		return m
	}
	wasSet, nowSet := in(was), in(now)
	var rd rangeDiff
	for _, r := range was {
		if !nowSet[r] {
			rd.del = append(rd.del, r)
		}
	}
	for _, r := range now {
		if !wasSet[r] {
			rd.add = append(rd.add, r)
		}
	}
	return rd
}

// queueChanges queues old → rs in an order the kernel accepts within one
// transaction: sets before the rules that name them, map entries removed
// before their chains, rules removed before their sets.
func queueChanges(c *nftables.Conn, old, rs *Ruleset) error {
	d := diff(old, rs)
	t := inet(PolicyTable(rs.Network))
	// Sets already in the kernel are named without an ID; the kernel
	// finds them by name.
	sets := map[string]*nftables.Set{}
	set := func(name string) *nftables.Set {
		if s, ok := sets[name]; ok {
			return s
		}
		return setSpec(t, name, rs.Sets[name].V6)
	}
	for _, name := range d.newSets {
		s := setSpec(t, name, rs.Sets[name].V6)
		if err := addSet(c, s, intervalElements(rs.Sets[name].Ranges)); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		sets[name] = s
	}
	for _, name := range sortedKeys(d.setElems) {
		rd, s := d.setElems[name], set(name)
		// removals first: a range that grew is its old interval out and
		// the new one in
		if err := chunked(intervalElements(rd.del), func(part []nftables.SetElement) error { return c.SetDeleteElements(s, part) }); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		if err := chunked(intervalElements(rd.add), func(part []nftables.SetElement) error { return c.SetAddElements(s, part) }); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	for _, ck := range d.newChains {
		ch := c.AddChain(&nftables.Chain{Name: ck.name, Table: t})
		addCounter(c, t, ck.name, Counts{})
		addChainRules(c, ch, rs.Network, ck.dir, set)
	}
	// A refilled chain keeps its counter object, and so its drop count.
	for _, ck := range d.refill {
		ch := &nftables.Chain{Name: ck.name, Table: t}
		c.FlushChain(ch)
		addChainRules(c, ch, rs.Network, ck.dir, set)
	}
	for _, name := range sortedKeys(d.mapElems) {
		md, m := d.mapElems[name], vmapSpec(t, name, name[len(name)-1] == '6')
		var del, add []nftables.SetElement
		for _, e := range md.del {
			del = append(del, nftables.SetElement{Key: e.ip.AsSlice()})
		}
		for _, e := range md.add {
			add = append(add, jumpElement(e.ip, e.chain))
		}
		if err := chunked(del, func(part []nftables.SetElement) error { return c.SetDeleteElements(m, part) }); err != nil {
			return fmt.Errorf("map %s: %w", name, err)
		}
		if err := chunked(add, func(part []nftables.SetElement) error { return c.SetAddElements(m, part) }); err != nil {
			return fmt.Errorf("map %s: %w", name, err)
		}
	}
	for _, name := range d.goneChains {
		c.DelChain(&nftables.Chain{Name: name, Table: t})
		c.DeleteObject(counterObj(t, name, Counts{})) // after the rule that used it
	}
	for _, name := range d.goneSets {
		c.DelSet(setSpec(t, name, old.Sets[name].V6))
	}
	return nil
}
