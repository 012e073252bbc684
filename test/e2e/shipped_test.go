package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

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

// TestShippedConflist runs conf/10-village.conflist (village + portmap) as
// shipped through ADD, CHECK and DEL, then with the reference firewall and
// bandwidth plugins chained after it, each checked for its effect: the
// bandwidth plugin's token bucket with the configured rate on the pod's host
// veth, and (with the node's FORWARD policy at DROP) the firewall plugin's
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
	if q := inNS(t, n.NS, "tc", "qdisc", "show", "dev", veth); !strings.Contains(q, "tbf") || !strings.Contains(q, "rate 8Mbit") {
		t.Fatalf("no token bucket at 8Mbit on the pod's host veth %s: %s", veth, q)
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
