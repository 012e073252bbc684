package e2e

import (
	"fmt"
	"io"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/wireguard"
)

// The kubernetes lab under backend wireguard (newWireGuardLab).
//
// The agents publish their public keys as Node annotations, the pods of
// three nodes ping each other and talk TCP; a capture of node1's underlay
// holds nothing between the nodes but WireGuard's UDP port (no VXLAN, no
// plaintext); node1's agent restarted keeps its key (the annotation stays
// the same) and its pods are reachable again.
func TestAgentWireGuard(t *testing.T) {
	lab, subnets := newWireGuardLab(t)
	keys := map[string]string{}
	for _, n := range lab.nodes {
		_, pub, err := wireguard.LoadKey(filepath.Join(n.Dir, "wg", "agt.key"))
		must(t, err, "the key file of %s", n.name)
		waitFor(t, 30*time.Second, n.name+" publishes its WireGuard key", func() (bool, string) {
			a := lab.node(n.name).Annotations
			return a[kubenames.AnnotationWireGuardKey] == pub.String(), fmt.Sprint(a)
		})
		keys[n.name] = pub.String()
	}
	if keys["node1"] == keys["node2"] || keys["node2"] == keys["node3"] || keys["node1"] == keys["node3"] {
		t.Fatalf("nodes share a key: %v", keys)
	}

	n1 := lab.nodes[0]
	capt := testenv.StartPcap(t, n1.NS, "lan0")
	pods := lab.podsPing(subnets)
	for i, p := range pods {
		if m := podMTU(t, p); m != 1440 {
			t.Errorf("pod on node%d: MTU %d, not the underlay's 1500 less WireGuard's 60", i+1, m)
		}
	}
	canary := fmt.Sprintf("village-e2e-wireguard-canary-%d", time.Now().UnixNano())
	to := podIPv4(t, pods[1])
	testenv.ServeTCP(t, pods[1].NS, to+":7777", canary)
	c, err := testenv.DialerIn(pods[0].NS)(to+":7777", 10*time.Second)
	must(t, err, "TCP pod on node1 -> pod on node2")
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(got) != canary {
		t.Fatalf("TCP across read %q (%v), want the canary", got, err)
	}
	raw, lines := capt.Stop()
	n := testenv.OnlyCarried(t, raw, lines, wgLabTunnel, wgLabAllowed, canary)
	t.Logf("node1's underlay: %d WireGuard packets between nodes, no plaintext", n)

	// Restart: the userspace device goes with the agent, and comes back
	// with the same key.
	must(t, n1.stop(t, syscall.SIGTERM), "stopping node1's agent")
	lab.start(n1)
	waitFor(t, 30*time.Second, "node1 routes to the others again", func() (bool, string) {
		return n1.hasRoutes(t, subnets[1:], nil)
	})
	waitFor(t, 30*time.Second, "pod on node1 -> pod on node2 after the restart", func() (bool, string) {
		err := testenv.Ping(pods[0].NS, to, 1)
		return err == nil, fmt.Sprint(err)
	})
	// node3's session is with node1's old device: node1 makes a new one
	// (at once, or after its quiet time when node3's key is the lower).
	waitFor(t, 30*time.Second, "pod on node3 -> pod on node1 after the restart", func() (bool, string) {
		err := testenv.Ping(pods[2].NS, podIPv4(t, pods[0]), 1)
		return err == nil, fmt.Sprint(err)
	})
	if a := lab.node(n1.name).Annotations[kubenames.AnnotationWireGuardKey]; a != keys[n1.name] {
		t.Fatalf("node1's key annotation changed across the restart: %s -> %s", keys[n1.name], a)
	}
}
