package agent

import (
	"testing"

	"github.com/village-cni/village/pkg/registry"
)

// hubFrom takes this node's hub mark from its own record in a registry
// batch (the kubernetes registry's Node label) and reports a change, so
// the loop runs a pass: a node labelled at run time turns its forwarding
// on and stops relaying through other hubs.
func TestHubFrom(t *testing.T) {
	a := &agent{c: &Conf{Node: "vps"}, opts: Options{Logf: func(string, ...any) {}}}
	a.self.Name = "vps"
	for _, c := range []struct {
		name  string
		batch registry.Batch
		hub   bool // a.self's mark after
		moved bool
	}{
		{"another node's record", registry.Batch{Nodes: []registry.Node{{Name: "home", Hub: true}}}, false, false},
		{"labelled", registry.Batch{Nodes: []registry.Node{{Name: "home"}, {Name: "vps", Hub: true}}}, true, true},
		{"the same again", registry.Batch{Nodes: []registry.Node{{Name: "vps", Hub: true}}}, true, false},
		{"a batch without it keeps the mark", registry.Batch{Removed: []string{"home"}}, true, false},
		{"unlabelled", registry.Batch{Nodes: []registry.Node{{Name: "vps"}}}, false, true},
	} {
		if moved := a.hubFrom(c.batch); moved != c.moved || a.self.WireGuardHub != c.hub {
			t.Errorf("%s: changed %v, hub %v; want %v, %v", c.name, moved, a.self.WireGuardHub, c.moved, c.hub)
		}
	}
}
