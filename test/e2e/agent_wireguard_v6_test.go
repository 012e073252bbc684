package e2e

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// TestAgentWireGuardIPv6Underlay: the wireguard backend over an underlay
// with no IPv4 address (ul6, a second LAN; the API server stays on lan0),
// carrying dual-stack pods. The nodes publish their IPv6 underlay address,
// the pods get the underlay's MTU less WireGuard's 80 over IPv6, every pod
// reaches every other in both families (a full-size ping with DF set too),
// and a capture of node1's underlay holds nothing between the nodes but
// WireGuard's UDP over IPv6, with a TCP canary sent across in each family
// nowhere in its bytes.
func TestAgentWireGuardIPv6Underlay(t *testing.T) {
	keyDir := t.TempDir()
	lab := newKubeLabWith(t, "wireguard", func(conf string, _ *kubetest.Server) string {
		conf = strings.Replace(wireGuardConf(conf, keyDir), `"underlay":"lan0"`, `"underlay":"ul6"`, 1)
		return strings.Replace(conf, fmt.Sprintf(`"clusterCIDR":%q`, agentCluster), fmt.Sprintf(`"clusterCIDR":"%s,fd70::/48"`, agentCluster), 1)
	})
	ul := NewLAN(t)
	for i, n := range lab.nodes {
		ul.Attach(t, n.NS, "ul6", "")
		testenv.MustIP(t, n.NS, "-6", "addr", "add", fmt.Sprintf("fd79::1%d/64", i+1), "dev", "ul6", "nodad")
		lab.createNode(n, fmt.Sprintf("10.70.%d.0/24,fd70:0:0:%d::/64", i+1, i+1))
	}
	wireGuardNodes(lab.agentLab, keyDir)
	subnets := lab.startAll()
	for i, n := range lab.nodes {
		if got, want := lab.node(n.name).Annotations[kubenames.AnnotationUnderlayIP], fmt.Sprintf("fd79::1%d", i+1); got != want {
			t.Fatalf("%s publishes underlay %q, want its IPv6 address %s", n.name, got, want)
		}
	}

	n1 := lab.nodes[0]
	capt := testenv.StartPcap(t, n1.NS, "ul6")
	pods := lab.podsPing(subnets)
	for i, p := range pods {
		if m := podMTU(t, p); m != 1420 {
			t.Fatalf("pod on node%d: MTU %d, not the underlay's 1500 less WireGuard's 80 over IPv6", i+1, m)
		}
	}
	canary := fmt.Sprintf("village-e2e-wireguard-v6-canary-%d", time.Now().UnixNano())
	for _, to := range []string{podIPv4(t, pods[1]), podIPv6(t, pods[1])} {
		// Full size with DF: 1420 less the ICMP header and the IP header.
		size := 1420 - 8 - 20
		if strings.Contains(to, ":") {
			size = 1420 - 8 - 40
		}
		out := inNS(t, pods[0].NS, "ping", "-c", "1", "-W", "5", "-M", "do", "-s", fmt.Sprint(size), to)
		if !strings.Contains(out, "1 received") {
			t.Fatalf("full-size DF ping to %s across the IPv6 underlay: %s", to, out)
		}
		hostPort := to + ":7777"
		if strings.Contains(to, ":") {
			hostPort = "[" + to + "]:7777"
		}
		testenv.ServeTCP(t, pods[1].NS, hostPort, canary)
		c, err := testenv.DialerIn(pods[0].NS)(hostPort, 10*time.Second)
		must(t, err, "TCP pod on node1 -> pod on node2 (%s)", hostPort)
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != canary {
			t.Fatalf("TCP to %s read %q (%v), want the canary", hostPort, got, err)
		}
	}
	raw, lines := capt.Stop()
	n := testenv.OnlyCarried(t, raw, lines, wgV6Tunnel, testenv.UnderlayChatter, canary)
	t.Logf("node1's IPv6 underlay: %d WireGuard packets between nodes, no plaintext", n)
}

// wgV6Tunnel is WireGuard's UDP between the nodes of the IPv6 underlay.
var wgV6Tunnel = regexp.MustCompile(`^\S+ IP6 fd79::1\d\.51820 > fd79::1\d\.51820: UDP, length \d+$`)
