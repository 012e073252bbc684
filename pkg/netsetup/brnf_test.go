package netsetup_test

import (
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netsetup"
)

// TestEnsureBridgeNetfilterOptions: a bridge Village creates, and one it
// finds with the options off, passes bridged IPv4 and IPv6 to netfilter.
func TestEnsureBridgeNetfilterOptions(t *testing.T) {
	node := testenv.NewNS(t)
	ensureBridge(t, node, netsetup.Bridge{Name: "vbr0"})
	if v4, v6 := testenv.BridgeNfCalls(t, node, "vbr0"); v4 != 1 || v6 != 1 {
		t.Errorf("created bridge: nf_call_iptables=%d nf_call_ip6tables=%d, want 1 1", v4, v6)
	}
	testenv.MustIP(t, node, "link", "add", "vbr1", "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0")
	if v4, v6 := testenv.BridgeNfCalls(t, node, "vbr1"); v4 != 0 || v6 != 0 {
		t.Fatalf("bridge made by ip: nf_call options %d %d, want 0 0 before EnsureBridge", v4, v6)
	}
	ensureBridge(t, node, netsetup.Bridge{Name: "vbr1"})
	if v4, v6 := testenv.BridgeNfCalls(t, node, "vbr1"); v4 != 1 || v6 != 1 {
		t.Errorf("existing bridge after EnsureBridge: nf_call_iptables=%d nf_call_ip6tables=%d, want 1 1", v4, v6)
	}
	// Only one of the two off is repaired too.
	testenv.MustIP(t, node, "link", "set", "vbr1", "type", "bridge", "nf_call_ip6tables", "0")
	ensureBridge(t, node, netsetup.Bridge{Name: "vbr1"})
	if v4, v6 := testenv.BridgeNfCalls(t, node, "vbr1"); v4 != 1 || v6 != 1 {
		t.Errorf("after ip6tables was turned off: nf_call_iptables=%d nf_call_ip6tables=%d, want 1 1", v4, v6)
	}
}

// TestBridgeNetfilterLoaded: the check sees br_netfilter from the calling
// thread's namespace (the module is loaded on the test machine, so each new
// namespace has /proc/sys/net/bridge).
func TestBridgeNetfilterLoaded(t *testing.T) {
	node := testenv.NewNS(t)
	in(t, node, netsetup.BridgeNetfilterLoaded)
}
