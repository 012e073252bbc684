package e2e

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/nodelocal"
)

// TestAgentWireGuardAPIFrozen: the wireguard backend with the API server
// frozen (SIGSTOP: its connections stay open and nothing answers). The
// tunnels keep carrying pod traffic; node1's agent restarted meanwhile
// makes its userspace device again with every peer and key from its own
// kept state, and its pods reach the other nodes' again; node2's
// underlay address moves (the old one removed), and node1 follows it from
// node2's authenticated packets alone (roaming), with no registry update.
// Thawed, node1 takes the registry's list in place of the kept peers
// (and keeps node2's new address from it).
func TestAgentWireGuardAPIFrozen(t *testing.T) {
	lab, subnets := newWireGuardLab(t)
	pods := lab.podsPing(subnets)
	n1, n2 := lab.nodes[0], lab.nodes[1]
	to := []string{podIPv4(t, pods[0]), podIPv4(t, pods[1]), podIPv4(t, pods[2])}

	thaw, err := lab.kube.FreezeAPIServer()
	must(t, err, "freezing the API server")
	t.Cleanup(thaw)
	must(t, testenv.Ping(pods[0].NS, to[1], 2), "pod on node1 -> pod on node2 with the API server frozen")

	must(t, n1.stop(t, syscall.SIGTERM), "stopping node1's agent")
	lab.start(n1)
	for j := 1; j < 3; j++ {
		waitFor(t, 60*time.Second, fmt.Sprintf("pod on node1 -> pod on node%d after node1's agent restarted with the API server frozen", j+1), func() (bool, string) {
			err := testenv.Ping(pods[0].NS, to[j], 1)
			return err == nil, fmt.Sprint(err) + "\n" + n1.log.String()
		})
	}

	moved := "192.168.79.42"
	// The old address goes first: deleting a primary address deletes the
	// secondaries of its subnet with it.
	testenv.MustIP(t, n2.NS, "addr", "del", n2.ip+"/24", "dev", "lan0")
	testenv.MustIP(t, n2.NS, "addr", "add", moved+"/24", "dev", "lan0")
	waitFor(t, 60*time.Second, "pod on node2 -> pod on node1 from node2's new underlay address", func() (bool, string) {
		err := testenv.Ping(pods[1].NS, to[0], 1)
		return err == nil, fmt.Sprint(err)
	})
	must(t, testenv.Ping(pods[0].NS, to[1], 2), "pod on node1 -> pod on node2 at its new address, the API server still frozen")

	// Thawed: node2 publishes its new address, and node1's registry list
	// replaces the kept peers (a sweep, as any first list).
	thaw()
	waitFor(t, 90*time.Second, "node1 keeps node2's new address from the registry's list", func() (bool, string) {
		var kept struct {
			Peers []struct {
				Name string
				IP   net.IP
			} `json:"peers"`
		}
		path := nodelocal.OverlayPeers(n1.runDir, "agt")
		found, err := nodelocal.ReadJSON(path, &kept)
		for _, p := range kept.Peers {
			if p.Name == n2.name && p.IP.String() == moved {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s: found %v, %v: %+v", path, found, err, kept.Peers)
	})
	must(t, testenv.Ping(pods[0].NS, to[1], 2), "pod on node1 -> pod on node2 with the API server back")
}
