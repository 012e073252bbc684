package agent

import (
	"fmt"
	"testing"

	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

// BenchmarkApplyBatchOneOf5000 is the agent's cost of one watch event (one
// changed record) on top of 5,000 peers: it should not grow with them.
func BenchmarkApplyBatchOneOf5000(b *testing.B) {
	c, err := Load(Options{ConfFile: write(b, "c.conflist", registryList), NodeName: "self"})
	if err != nil {
		b.Fatal(err)
	}
	n := &node{c: c}
	rec := func(i, gen int) registry.Node {
		return registry.Node{Name: fmt.Sprintf("n%04d", i), IP: fmt.Sprintf("172.%d.%d.%d", 20+gen, i/250, 1+i%250),
			PodCIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", 80+i/256, i%256)}}
	}
	full := registry.Batch{Full: true}
	for i := range 5000 {
		full.Nodes = append(full.Nodes, rec(i, 0))
	}
	view := map[string]overlay.Node{}
	if _, bad := n.applyBatch(view, full); len(view) != 5000 {
		b.Fatalf("view of %d peers: %v", len(view), bad)
	}
	b.ResetTimer()
	for i := range b.N {
		ch, _ := n.applyBatch(view, registry.Batch{Nodes: []registry.Node{rec(i%5000, 1+(i/5000)%2)}})
		if len(ch.Updated) != 1 {
			b.Fatalf("change %d of %d: %+v", i, b.N, ch)
		}
	}
}
