package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"

	"github.com/village-cni/village/pkg/netpol/table"
)

// prefixRange is the range a prefix covers.
func prefixRange(p netip.Prefix) table.Range {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	to, _ := netip.AddrFromSlice(b)
	return table.Range{From: p.Addr(), To: to}
}

// subtract is r less the ranges in cut (all of r's family).
func subtract(r table.Range, cut []table.Range) []table.Range {
	cut = normalize(cut)
	out := []table.Range{}
	cur := r.From
	for _, c := range cut {
		if c.To.Less(cur) || r.To.Less(c.From) {
			continue
		}
		if cur.Less(c.From) {
			out = append(out, table.Range{From: cur, To: c.From.Prev()})
		}
		if !c.To.Less(r.To) {
			return out
		}
		cur = c.To.Next()
	}
	return append(out, table.Range{From: cur, To: r.To})
}

// normalize sorts ranges and merges the ones that overlap or touch.
func normalize(rs []table.Range) []table.Range {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b table.Range) int { return a.From.Compare(b.From) })
	var out []table.Range
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
