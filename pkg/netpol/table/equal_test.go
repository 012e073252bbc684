package table

import (
	"net/netip"
	"testing"
)

func sample() *Ruleset {
	a := netip.MustParseAddr
	return &Ruleset{
		Network: "net",
		Pods: []PodRules{{Key: "ns/a", IPs: []netip.Addr{a("10.0.0.2")},
			Ingress: &Chain{Clauses: []Clause{{Set4: "s4", Proto: ProtoTCP, PortFrom: 80, PortTo: 80}}},
			Egress:  &Chain{Clauses: []Clause{}}}},
		Sets:       map[string]Set{"s4": {Ranges: []Range{{From: a("10.0.0.3"), To: a("10.0.0.3")}}}},
		Problems:   []Problem{{Policy: "ns/p", Reason: "r"}},
		Namespaces: []string{"ns"},
		Compiled:   []netip.Addr{a("10.0.0.2")},
	}
}

func TestEqual(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name  string
		edit  func(*Ruleset)
		equal bool
	}{
		{"same", func(*Ruleset) {}, true},
		{"network", func(r *Ruleset) { r.Network = "other" }, false},
		{"pod key", func(r *Ruleset) { r.Pods[0].Key = "ns/b" }, false},
		{"pod address", func(r *Ruleset) { r.Pods[0].IPs[0] = a("10.0.0.9") }, false},
		{"pod gone", func(r *Ruleset) { r.Pods = nil }, false},
		{"port", func(r *Ruleset) { r.Pods[0].Ingress.Clauses[0].PortTo = 81 }, false},
		{"clause added", func(r *Ruleset) {
			r.Pods[0].Egress.Clauses = append(r.Pods[0].Egress.Clauses, Clause{AnyPeer: true})
		}, false},
		{"egress no longer isolated", func(r *Ruleset) { r.Pods[0].Egress = nil }, false},
		{"empty clauses nil or not", func(r *Ruleset) { r.Pods[0].Egress.Clauses = nil }, true},
		{"set member", func(r *Ruleset) { r.Sets["s4"].Ranges[0].To = a("10.0.0.4") }, false},
		{"set renamed", func(r *Ruleset) { r.Sets["s5"] = r.Sets["s4"]; delete(r.Sets, "s4") }, false},
		{"set family", func(r *Ruleset) { s := r.Sets["s4"]; s.V6 = true; r.Sets["s4"] = s }, false},
		{"problem", func(r *Ruleset) { r.Problems = nil }, false},
		{"namespace", func(r *Ruleset) { r.Namespaces = append(r.Namespaces, "ns2") }, false},
		{"compiled", func(r *Ruleset) { r.Compiled = append(r.Compiled, a("10.0.0.5")) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := sample()
			tc.edit(b)
			if got := Equal(sample(), b); got != tc.equal {
				t.Errorf("Equal = %v, want %v", got, tc.equal)
			}
			if got := Equal(b, sample()); got != tc.equal {
				t.Errorf("Equal reversed = %v, want %v", got, tc.equal)
			}
		})
	}
	if !Equal(nil, nil) || Equal(sample(), nil) || Equal(nil, sample()) {
		t.Error("nil tables: want equal only to each other")
	}
}
