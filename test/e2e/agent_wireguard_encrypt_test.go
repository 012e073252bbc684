package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
)

// "encrypt": true with backend auto, where no WireGuard device can be made
// (userspace "never" on this machine, whose kernel has no WireGuard): auto
// does not fall back to host-gw or vxlan. The nodes have a default route
// out of the underlay, which a pod packet with no route through WireGuard
// would follow in the clear; the agent's unreachable route for clusterCIDR
// refuses it instead. A capture of node1's underlay while its pod pings
// and dials node2's holds no pod packet. Then node1's agent restarts
// with backend vxlan: its seal goes, and node1 routes to node2's pod
// subnet through the VXLAN device.
func TestAgentEncryptFailsClosed(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "agt.key")
	encrypt := fmt.Sprintf(`"encrypt":true,"wireguard":{"keyFile":%q,"userspace":"never"},`, keyFile)
	lab := newKubeLabOf(t, "auto", 2, func(conf string, _ *kubetest.Server) string {
		return strings.Replace(conf, `"vni":9,`, encrypt, 1)
	})
	var subnets []string
	for i, n := range lab.nodes {
		subnets = append(subnets, fmt.Sprintf("10.70.%d.0/24", i+1))
		lab.createNode(n, subnets[i])
		wireGuardNode(t, n, filepath.Dir(keyFile))
		testenv.MustIP(t, n.NS, "route", "add", "default", "via", agentEtcdIP)
	}
	for _, n := range lab.nodes {
		lab.start(n)
	}
	n1 := lab.nodes[0]
	for _, n := range lab.nodes {
		waitFor(t, 60*time.Second, n.name+" fails to make a WireGuard device and seals clusterCIDR", func() (bool, string) {
			r, _ := testenv.IP(n.NS, "route", "show", agentCluster)
			return strings.Contains(n.log.String(), "no WireGuard support") && strings.Contains(r, "unreachable "+agentCluster), n.log.String() + "\n" + r
		})
	}
	for _, n := range lab.nodes {
		if r := n.routes(t); r != "" {
			t.Fatalf("%s routes to peers without WireGuard:\n%s", n.name, r)
		}
		if l, _ := testenv.IP(n.NS, "link", "show", "type", "vxlan"); l != "" {
			t.Fatalf("%s has a VXLAN device:\n%s", n.name, l)
		}
	}
	var pods []*Pod
	for _, n := range lab.nodes {
		p := n.NewPod()
		n.MustAdd(lab.list, p)
		pods = append(pods, p)
	}
	to := podIPv4(t, pods[1])
	capt := testenv.StartPcap(t, n1.NS, "lan0")
	if err := testenv.Ping(pods[0].NS, to, 3); err == nil {
		t.Fatalf("pod on node1 reached pod on node2 (%s) with no WireGuard", to)
	}
	if c, err := testenv.DialerIn(pods[0].NS)(to+":7777", 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("pod on node1 connected to node2's pod with no WireGuard")
	}
	_, lines := capt.Stop()
	for _, l := range lines {
		if strings.Contains(l, "10.70.") || strings.Contains(l, ".4789 ") {
			t.Fatalf("a pod packet crossed node1's underlay:\n%s", strings.Join(lines, "\n"))
		}
	}
	t.Logf("node1's underlay: %d packets, none a pod's", len(lines))

	must(t, n1.stop(t, syscall.SIGTERM), "stopping villaged on node1")
	conf, err := os.ReadFile(lab.conf)
	must(t, err, "reading the conflist")
	plain := strings.Replace(strings.Replace(string(conf), `"type":"auto",`, `"type":"vxlan",`, 1), encrypt, `"vni":9,`, 1)
	if !strings.Contains(plain, `"type":"vxlan",`) || strings.Contains(plain, "encrypt") {
		t.Fatalf("the conflist is not the lab's auto with encrypt:\n%s", conf)
	}
	n1.conf = filepath.Join(t.TempDir(), "10-agt.conflist")
	must(t, os.WriteFile(n1.conf, []byte(plain), 0o644), "writing node1's vxlan conflist")
	lab.start(n1)
	waitFor(t, 60*time.Second, "node1 under vxlan removes its seal and routes node2's pods through VXLAN", func() (bool, string) {
		r, _ := testenv.IP(n1.NS, "route", "show")
		return !strings.Contains(r, "unreachable "+agentCluster) && strings.Contains(r, subnets[1]+" via") && strings.Contains(r, "village.9"), r
	})
}
