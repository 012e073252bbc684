package table

import (
	"fmt"
	"strings"
)

// String renders the ruleset with sets inline, one pod a line, for logs
// and tests:
//
//	ns/a in[{10.0.0.2} tcp/80 | any udp/53-54] eg[]
func (rs *Ruleset) String() string {
	var b strings.Builder
	for _, p := range rs.Pods {
		fmt.Fprintf(&b, "%s in%s eg%s\n", p.Key, rs.chain(p.Ingress), rs.chain(p.Egress))
	}
	for _, pr := range rs.Problems {
		fmt.Fprintf(&b, "problem %s\n", pr)
	}
	return b.String()
}

func (rs *Ruleset) chain(ch *Chain) string {
	if ch == nil {
		return "-"
	}
	parts := make([]string, len(ch.Clauses))
	for i, cl := range ch.Clauses {
		parts[i] = rs.clause(cl)
	}
	return "[" + strings.Join(parts, " | ") + "]"
}

func (rs *Ruleset) clause(cl Clause) string {
	peer := "any"
	if !cl.AnyPeer {
		var elems []string
		for _, name := range []string{cl.Set4, cl.Set6} {
			if name == "" {
				continue
			}
			for _, r := range rs.Sets[name].Ranges {
				if r.From == r.To {
					elems = append(elems, r.From.String())
				} else {
					elems = append(elems, r.From.String()+"-"+r.To.String())
				}
			}
		}
		peer = "{" + strings.Join(elems, ",") + "}"
	}
	switch {
	case cl.Proto == ProtoAny:
		return peer
	case cl.PortFrom == 0:
		return peer + " " + cl.Proto.String()
	case cl.PortFrom == cl.PortTo:
		return fmt.Sprintf("%s %s/%d", peer, cl.Proto, cl.PortFrom)
	}
	return fmt.Sprintf("%s %s/%d-%d", peer, cl.Proto, cl.PortFrom, cl.PortTo)
}
