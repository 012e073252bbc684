package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
)

// shippedList is conf/10-village.conflist as shipped, with a data dir in
// the test node, the village entry's keys set from set, and the given
// plugins chained after its own.
func shippedList(t *testing.T, n *Node, set map[string]any, chained ...string) *libcni.NetworkConfigList {
	b, err := os.ReadFile(filepath.Join(confDir(t), "10-village.conflist"))
	must(t, err, "reading the shipped conflist")
	var list map[string]any
	must(t, json.Unmarshal(b, &list), "decoding the shipped conflist")
	plugins := list["plugins"].([]any)
	ipam := plugins[0].(map[string]any)["ipam"].(map[string]any)
	ipam["dataDir"] = filepath.Join(n.Dir, "ipam")
	for k, v := range set {
		plugins[0].(map[string]any)[k] = v
	}
	for _, c := range chained {
		var p any
		must(t, json.Unmarshal([]byte(c), &p), "chained plugin %s", c)
		plugins = append(plugins, p)
	}
	list["plugins"] = plugins
	out, err := json.Marshal(list)
	must(t, err, "encoding")
	return ConfList(t, string(out))
}

// TestShippedConflist runs conf/10-village.conflist (village, portmap, bandwidth) as
// shipped through ADD, CHECK and DEL, then with the reference firewall and
// bandwidth plugins chained after it, each checked for its effect: the
// bandwidth plugin holds TCP from the node to the pod below 3x its rate
// (the same path without it runs above 10x), and (with the node's FORWARD policy at DROP) the firewall plugin's
// rules admitting the pod's own traffic to a routed client and its replies,
// while a new connection from the client to the pod is denied; after DEL
// both are gone.
func TestShippedConflist(t *testing.T) {
	n := NewNode(t)
	l := shippedList(t, n, nil)
	a, b := n.NewPod(), n.NewPod()
	ra := n.MustAdd(l, a)
	rb := n.MustAdd(l, b)
	if len(ra.IPs) != 2 || !strings.HasPrefix(ra.IPs[0].Address.String(), "10.244.1.") {
		t.Fatalf("shipped conflist result: %v", ra.IPs)
	}
	for _, ipc := range rb.IPs {
		must(t, testenv.Ping(a.NS, ipc.Address.IP.String(), 2), "pod a -> pod b %s", ipc.Address.IP)
	}
	must(t, n.Check(l, a), "CHECK")
	// Without the bandwidth plugin, node -> pod runs at veth speed.
	unlimited := tcpRate(t, b.NS, rb.IPs[0].Address.IP.String(), n.NS)
	must(t, n.Del(l, a), "DEL")
	must(t, n.Del(l, b), "DEL")

	// A client routed through the node: traffic between it and a pod crosses
	// the node's FORWARD chain, whose policy is DROP.
	client := testenv.NewNS(t)
	testenv.MustIP(t, n.NS, "link", "add", "cli0", "type", "veth", "peer", "name", "eth0", "netns", filepath.Base(client.Path()))
	testenv.MustIP(t, n.NS, "addr", "add", "10.99.0.1/24", "dev", "cli0")
	testenv.MustIP(t, n.NS, "link", "set", "cli0", "up")
	testenv.MustIP(t, client, "addr", "add", "10.99.0.2/24", "dev", "eth0")
	testenv.MustIP(t, client, "link", "set", "eth0", "up")
	testenv.MustIP(t, client, "route", "add", "10.244.1.0/24", "via", "10.99.0.1")
	inNS(t, n.NS, "iptables", "-P", "FORWARD", "DROP")

	const rate = 8000000 // bits per second: tc prints 8Mbit
	// With the firewall plugin in the chain, it decides what is forwarded:
	// Village's own forward accept rules are turned off.
	l = shippedList(t, n, map[string]any{"forwardAccept": false}, `{"type":"firewall","backend":"iptables"}`,
		fmt.Sprintf(`{"type":"bandwidth","ingressRate":%d,"ingressBurst":100000}`, rate))
	p := n.NewPod()
	r := n.MustAdd(l, p)
	podIP, veth := r.IPs[0].Address.IP.String(), r.Interfaces[1].Name
	// The limit in traffic, not text: node -> pod through the host veth
	// is held well below 3x the rate while the same path without the
	// plugin ran above 10x (generous ratios: no timing is close to a bound).
	limited := tcpRate(t, p.NS, podIP, n.NS)
	t.Logf("node -> pod: %.1f Mbit/s with ingressRate 8 Mbit/s on %s, %.1f Mbit/s without", limited/1e6, veth, unlimited/1e6)
	if limited >= 3*rate || unlimited <= 10*rate {
		t.Fatalf("node -> pod at %.1f Mbit/s with an 8 Mbit/s ingressRate (want < 24), %.1f Mbit/s without (want > 80)", limited/1e6, unlimited/1e6)
	}
	must(t, testenv.Ping(p.NS, "10.99.0.2", 2), "pod -> routed client (the firewall plugin admits the pod's traffic and its replies)")
	if err := testenv.Ping(client, podIP, 1); err == nil {
		t.Fatal("a new connection from the client reached the pod: the firewall plugin's rules should only admit replies")
	}
	must(t, n.Check(l, p), "CHECK of the chain")
	noneLeft(t, filepath.Join(n.Dir, "ipam"), "DEL of the chain", func() { must(t, n.Del(l, p), "DEL") })
	if fw := inNS(t, n.NS, "iptables", "-S", "CNI-FORWARD"); strings.Contains(fw, podIP) {
		t.Fatalf("the firewall plugin's rules for %s outlived DEL:\n%s", podIP, fw)
	}
	if err := testenv.Ping(p.NS, "10.99.0.2", 1); err == nil {
		t.Fatal("the pod still reaches the client after DEL")
	}
}

// tcpRate runs iperf3's server in dst (bound to ip, one test) and a 3 s TCP
// test from src, and returns the rate the server received in bits/s.
func tcpRate(t *testing.T, dst ns.NetNS, ip string, src ns.NetNS) float64 {
	t.Helper()
	srv := exec.Command("ip", "netns", "exec", filepath.Base(dst.Path()), "iperf3", "-s", "-1", "-B", ip, "-p", "5201")
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	must(t, srv.Start(), "starting iperf3 -s")
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	// The server listens before the client connects: polled, not slept.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if out, _ := exec.Command("ip", "netns", "exec", filepath.Base(dst.Path()), "ss", "-Hltn", "sport", "= :5201").Output(); strings.TrimSpace(string(out)) != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("iperf3 -s in %s not listening after 60s: %s", dst.Path(), srvOut.String())
		}
	}
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(src.Path()), "iperf3", "-c", ip, "-p", "5201", "-t", "3", "-J").Output()
	if err != nil {
		t.Fatalf("iperf3 -c %s: %v\n%s", ip, err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.End.SumReceived.BitsPerSecond <= 0 {
		t.Fatalf("iperf3 -c %s: %v: %s", ip, err, out)
	}
	return res.End.SumReceived.BitsPerSecond
}
