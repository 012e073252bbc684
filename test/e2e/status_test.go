package e2e

import (
	"strings"
	"testing"
)

// TestStatusWithBrNetfilter: a node namespace shows br_netfilter's sysctls
// (the module is loaded machine-wide here), and STATUS through libcni
// succeeds there. A namespace cannot unload a module, so the absent case
// (STATUS fails with code 50) is pkg/village's TestCheckBrNetfilter.
func TestStatusWithBrNetfilter(t *testing.T) {
	n := NewNode(t)
	if out := inNS(t, n.NS, "ls", "/proc/sys/net/bridge"); !strings.Contains(out, "bridge-nf-call-iptables") {
		t.Fatalf("the node namespace shows no br_netfilter sysctls:\n%s", out)
	}
	l := ConfList(t, villageList(n, "brnf", "1.1.0", "10.40.0.0/24", ""))
	must(t, n.Status(l), "STATUS with br_netfilter loaded")
}
