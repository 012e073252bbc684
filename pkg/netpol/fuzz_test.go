package netpol

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/village-cni/village/pkg/netpol/table"

	networkingv1 "k8s.io/api/networking/v1"
)

// FuzzCompile feeds arbitrary policy specs (JSON) to Compile over the test
// world: it must never panic, and what it emits must hold together: every
// clause's sets exist, are of their family and are sorted, disjoint
// intervals; every isolated pod is local.
func FuzzCompile(f *testing.F) {
	f.Add(`{"podSelector":{},"policyTypes":["Ingress","Egress"]}`)
	f.Add(`{"podSelector":{"matchLabels":{"app":"web"}},"ingress":[{"from":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.0.1.0/24","10.0.1.128/25"]}}],"ports":[{"protocol":"UDP","port":53,"endPort":60}]}]}`)
	f.Add(`{"podSelector":{},"egress":[{"to":[{"namespaceSelector":{},"podSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["api"]}]}}],"ports":[{"port":"http"}]}]}`)
	f.Add(`{"podSelector":{},"ingress":[{"from":[{"ipBlock":{"cidr":"::/0","except":["::ffff:0:0/96"]}},{"ipBlock":{"cidr":"::ffff:10.0.0.0/104"}}]}]}`)
	f.Fuzz(func(t *testing.T, spec string) {
		var s networkingv1.NetworkPolicySpec
		if json.Unmarshal([]byte(spec), &s) != nil {
			return
		}
		in := world(policy("a", "f", s), policy("b", "f", s))
		rs := Compile(in)
		for _, p := range rs.Pods {
			if !in.Local[p.Key] {
				t.Fatalf("compiled remote pod %s", p.Key)
			}
			for _, ch := range []*table.Chain{p.Ingress, p.Egress} {
				if ch == nil {
					continue
				}
				for _, cl := range ch.Clauses {
					if cl.PortFrom > cl.PortTo || (cl.Proto == table.ProtoAny && cl.PortFrom != 0) {
						t.Fatalf("bad ports in %+v", cl)
					}
					if !cl.AnyPeer && cl.Set4 == "" && cl.Set6 == "" {
						t.Fatalf("clause with no peer: %+v", cl)
					}
					for _, name := range []string{cl.Set4, cl.Set6} {
						if name == "" {
							continue
						}
						set, ok := rs.Sets[name]
						if !ok {
							t.Fatalf("clause names missing set %s", name)
						}
						checkSet(t, name, set)
					}
				}
			}
		}
	})
}

func checkSet(t *testing.T, name string, s table.Set) {
	var last netip.Addr
	for i, r := range s.Ranges {
		if r.From.Is4() == s.V6 || r.To.Is4() == s.V6 || r.To.Less(r.From) {
			t.Fatalf("set %s: bad range %v", name, r)
		}
		if i > 0 && !last.Next().Less(r.From) {
			t.Fatalf("set %s: ranges overlap or touch: %v", name, s.Ranges)
		}
		last = r.To
	}
}
