package table

import (
	"maps"
	"slices"
)

// Equal reports whether a and b are the same table. The controller
// compiles on every change it watches and goes to the kernel only when the
// result differs, so this runs as often as Compile: it compares in place,
// without rendering either side. Sets compare by name and content (the
// rules name them), so two tables are equal only when the kernel would
// hold the same objects.
func Equal(a, b *Ruleset) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Network == b.Network &&
		slices.EqualFunc(a.Pods, b.Pods, PodRules.equal) &&
		maps.EqualFunc(a.Sets, b.Sets, Set.equal) &&
		slices.Equal(a.Problems, b.Problems) &&
		slices.Equal(a.Namespaces, b.Namespaces) &&
		slices.Equal(a.Compiled, b.Compiled)
}

func (p PodRules) equal(q PodRules) bool {
	return p.Key == q.Key && slices.Equal(p.IPs, q.IPs) && p.Ingress.equal(q.Ingress) && p.Egress.equal(q.Egress)
}

// equal: a nil chain (the direction not isolated) differs from an empty
// one (nothing allowed).
func (c *Chain) equal(d *Chain) bool {
	if c == nil || d == nil {
		return c == d
	}
	return slices.Equal(c.Clauses, d.Clauses)
}

func (s Set) equal(t Set) bool { return s.V6 == t.V6 && slices.Equal(s.Ranges, t.Ranges) }
