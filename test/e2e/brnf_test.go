package e2e

// A Service whose endpoint shares the client's bridge, on a node where the
// bridge-nf-call sysctls are 0: kube-proxy's DNAT in nat PREROUTING sees
// the request (routed to the gateway) but, unless the bridge sends what it
// forwards through netfilter, not the reply (bridged straight back), which
// the client then refuses as coming from the wrong address.

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netsetup"
)

// brnfNode is a node whose bridge-nf-call sysctls are 0 (in its own
// namespace only) with a ClusterIP-like DNAT for each family: vip port 80
// to the endpoint pod's port 8080.
func brnfNode(t *testing.T) *Node {
	t.Helper()
	n := NewNode(t)
	for _, s := range []string{"net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0"} {
		inNS(t, n.NS, "sysctl", "-qw", s)
	}
	return n
}

// serviceVIPs are the virtual addresses the DNAT rules answer on.
var serviceVIPs = map[string]string{"iptables": "10.96.0.10", "ip6tables": "fd00:96::10"}

// addService writes kube-proxy's ClusterIP rule for one family: TCP to
// vip:80 DNATed to ep:8080.
func addService(t *testing.T, n *Node, tool, vip, ep string) {
	t.Helper()
	to := ep + ":8080"
	if tool == "ip6tables" {
		to = "[" + ep + "]:8080"
	}
	inNS(t, n.NS, tool, "-w", "-t", "nat", "-A", "PREROUTING", "-d", vip, "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", to)
}

// echoServer listens on port 8080 of every address of pod and answers each
// connection with "pong".
func echoServer(t *testing.T, pod *Pod) {
	t.Helper()
	testenv.ServeTCP(t, pod.NS, ":8080", "pong")
}

// viaVIP opens a TCP connection from pod to vip:80 and reads the answer.
func viaVIP(pod *Pod, vip string) error {
	return testenv.InNS(pod.NS, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(vip, "80"), 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if string(b) != "pong" {
			return fmt.Errorf("answer %q, want pong", b)
		}
		return nil
	})
}

func addrsByFamily(r *current.Result) map[string]string {
	out := map[string]string{}
	for _, ipc := range r.IPs {
		if ipc.Address.IP.To4() != nil {
			out["iptables"] = ipc.Address.IP.String()
		} else {
			out["ip6tables"] = ipc.Address.IP.String()
		}
	}
	return out
}

// sameBridgeService adds a client and an endpoint pod with l and connects
// from one to the other through each family's virtual IP.
func sameBridgeService(t *testing.T, n *Node, l *libcni.NetworkConfigList) map[string]error {
	t.Helper()
	client, ep := n.NewPod(), n.NewPod()
	n.MustAdd(l, client)
	eps := addrsByFamily(n.MustAdd(l, ep))
	echoServer(t, ep)
	got := map[string]error{}
	for tool, vip := range serviceVIPs {
		addService(t, n, tool, vip, eps[tool])
		got[tool] = viaVIP(client, vip)
	}
	return got
}

func TestSameBridgeServiceWithoutBridgeNfSysctl(t *testing.T) {
	if err := netsetup.BridgeNetfilterLoaded(); err != nil {
		t.Fatalf("this test needs br_netfilter loaded on the machine: %v", err)
	}
	t.Run("village", func(t *testing.T) {
		n := brnfNode(t)
		l := ConfList(t, villageList(n, "brnf", "1.1.0", "10.37.0.0/24", "fd37::/64"))
		for tool, err := range sameBridgeService(t, n, l) {
			must(t, err, "%s: pod to a same-bridge endpoint through virtual IP %s", tool, serviceVIPs[tool])
		}
		if v4, v6 := testenv.BridgeNfCalls(t, n.NS, "vlg-brnf"); v4 != 1 || v6 != 1 {
			t.Errorf("bridge options nf_call_iptables=%d nf_call_ip6tables=%d, want 1 1", v4, v6)
		}
	})
	// Control: the reference bridge leaves the bridge's options at 0, so
	// with the sysctls 0 the reply skips the un-DNAT and the client refuses it.
	t.Run("reference-bridge", func(t *testing.T) {
		n := brnfNode(t)
		l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.0.0","name":"refbrnf","plugins":[{"type":"bridge","bridge":"refbrnf","isDefaultGateway":true,
			"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.38.0.0/24"}],[{"subnet":"fd38::/64"}]]}}]}`, n.Dir+"/hl"))
		for tool, err := range sameBridgeService(t, n, l) {
			if err == nil {
				t.Errorf("%s: the reference bridge reached a same-bridge endpoint through %s with the sysctls 0: the test does not reproduce the fault", tool, serviceVIPs[tool])
			}
		}
	})
}
