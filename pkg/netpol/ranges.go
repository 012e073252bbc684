package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
)

// prefixRange is the range a prefix covers.
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	to, _ := netip.AddrFromSlice(b)
	return Range{From: p.Addr(), To: to}
}

// subtract is r less the ranges in cut (all of r's family).
func subtract(r Range, cut []Range) []Range {
	cut = normalize(cut)
	out := []Range{}
	cur := r.From
	for _, c := range cut {
		if c.To.Less(cur) || r.To.Less(c.From) {
			continue
		}
		if cur.Less(c.From) {
			out = append(out, Range{From: cur, To: c.From.Prev()})
		}
		if !c.To.Less(r.To) {
			return out
		}
		cur = c.To.Next()
	}
	return append(out, Range{From: cur, To: r.To})
}

// normalize sorts ranges and merges the ones that overlap or touch.
func normalize(rs []Range) []Range {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Range) int { return a.From.Compare(b.From) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.To.Next() // invalid when last.To is the family's last address
			if !next.IsValid() || !next.Less(r.From) {
				if last.To.Less(r.To) {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// setName names the peer set of one rule of one policy (origin says
// which: policy, direction, rule, port group) by that origin, not by its
// content, so a pod that comes or goes changes the set's elements and
// nothing else.
func setName(v6 bool, origin string) string {
	h := sha256.Sum256([]byte(origin))
	prefix := "s4-"
	if v6 {
		prefix = "s6-"
	}
	return prefix + hex.EncodeToString(h[:8])
}
