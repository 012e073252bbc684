package table

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// Summary is the shape of a policy table: its chains, and how many
// elements (address ranges, map entries) each set and map holds. It is
// what Check compares: a hand edit, a flushed table or a lost set shows
// as a difference.
type Summary struct {
	Chains []string       `json:"chains"`
	Sets   map[string]int `json:"sets"`
}

// Summarize is the Summary Apply installs for rs.
func Summarize(rs *Ruleset) Summary {
	s := Summary{Chains: []string{"forward"}, Sets: map[string]int{"ingress4": 0, "ingress6": 0, "egress4": 0, "egress6": 0}}
	for name, set := range rs.Sets {
		s.Sets[name] = len(set.Ranges)
	}
	for _, p := range rs.Pods {
		for _, d := range []struct {
			name string
			ch   *Chain
		}{{"ingress", p.Ingress}, {"egress", p.Egress}} {
			if d.ch == nil {
				continue
			}
			s.Chains = append(s.Chains, chainName(d.name[:2], p.Key))
			for _, ip := range p.IPs {
				s.Sets[d.name+map[bool]string{false: "4", true: "6"}[ip.Is6()]]++
			}
		}
	}
	slices.Sort(s.Chains)
	return s
}

// Observe reads the Summary of network's policy table from the kernel;
// ok false when the table is missing.
func Observe(network string) (s Summary, ok bool, err error) {
	c, err := open()
	if err != nil {
		return s, false, fmt.Errorf("failed to open nftables: %w", err)
	}
	name := PolicyTable(network)
	if ok, err := tableExists(c, name); !ok {
		return s, false, err
	}
	t := inet(name)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return s, false, fmt.Errorf("failed to list nftables chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == name {
			s.Chains = append(s.Chains, ch.Name)
		}
	}
	slices.Sort(s.Chains)
	sets, err := c.GetSets(t)
	if err != nil {
		return s, false, fmt.Errorf("failed to list the sets of table inet %s: %w", name, err)
	}
	s.Sets = map[string]int{}
	for _, set := range sets {
		elems, err := c.GetSetElements(set)
		if err != nil {
			return s, false, fmt.Errorf("failed to list set %s of table inet %s: %w", set.Name, name, err)
		}
		n := 0
		for _, e := range elems {
			if !e.IntervalEnd {
				n++
			}
		}
		s.Sets[set.Name] = n
	}
	return s, true, nil
}

// Diff says how have differs from want ("" when it does not).
func Diff(want, have Summary) string {
	var out []string
	if !slices.Equal(want.Chains, have.Chains) {
		out = append(out, fmt.Sprintf("%d chains, want %d", len(have.Chains), len(want.Chains)))
	}
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		n, ok := have.Sets[name]
		switch {
		case !ok:
			out = append(out, "set "+name+" missing")
		case n != want.Sets[name]:
			out = append(out, fmt.Sprintf("set %s holds %d elements, want %d", name, n, want.Sets[name]))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(have.Sets)) {
		if _, ok := want.Sets[name]; !ok {
			out = append(out, "extra set "+name)
		}
	}
	return strings.Join(out, "; ")
}

// PendingPresent says whether network's pending table is in the kernel.
func PendingPresent(network string) (bool, error) {
	c, err := open()
	if err != nil {
		return false, fmt.Errorf("failed to open nftables: %w", err)
	}
	return tableExists(c, PendingTable(network))
}
