package e2e

import (
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestReclaimSparesLiveNodesLANWithoutNodeName is the hazard of issue 37:
// the agents run as node1..node3 (--node-name), which is not the machine's
// host name; the registry is in etcd and the LAN pool in the same etcd with
// no ipam.store.nodeName. LAN pods are made through the real plugin on
// node1 and node2, then node3's agent is killed and reclaimed. The live
// nodes' LAN allocations must be recorded under their agents' names and
// survive every reclaim pass: were they recorded under the host name (which
// has no registry record), the reclaimer would take that name for a
// departed node and free live pods' addresses after reclaimAfter.
func TestReclaimSparesLiveNodesLANWithoutNodeName(t *testing.T) {
	host, err := os.Hostname()
	must(t, err, "reading the host name")
	lab := newAgentLab(t, "vxlan", `,"reclaimAfter":2`,
		`,"macvlan":{"master":"lan0","ifName":"net1","ipam":{"type":"village-ipam",`+reclaimLAN+`}}`)
	subnets := lab.startAll()
	for _, n := range lab.nodes {
		if n.name == strings.ToLower(host) {
			t.Fatalf("the lab's node name %s is the host name: the test would prove nothing", n.name)
		}
	}
	_, lanNet, _ := net.ParseCIDR("192.168.79.0/24")
	live := map[string]string{} // LAN address -> node that holds it
	for _, n := range lab.nodes[:2] {
		r := n.MustAdd(lab.list, n.NewPod())
		for _, ip := range r.IPs {
			if lanNet.Contains(ip.Address.IP) {
				live[ip.Address.IP.String()] = n.name
			}
		}
	}
	if len(live) != 2 {
		t.Fatalf("LAN addresses of the live nodes' pods: %v, want one each", live)
	}
	cli := lab.etcd.ClientIn(t, lab.host)
	ctx := context.Background()
	get := func(key string) string {
		resp, err := cli.Get(ctx, key)
		must(t, err, "reading %s", key)
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	// node3 departs: once its lease is reclaimed and no departure marker
	// is left, every holder the reclaimer took for departed (node3, and a
	// host-name holder marked no later than node3) has been acted on.
	n3 := lab.nodes[2]
	_ = n3.stop(t, syscall.SIGKILL)
	logs := func() string { return lab.nodes[0].log.String() + lab.nodes[1].log.String() }
	waitFor(t, 90*time.Second, "a survivor reclaims node3's subnet lease", func() (bool, string) {
		return get("/village/subnets/agt/"+subnets[2]) == "", logs()
	})
	waitFor(t, 90*time.Second, "no departure markers left", func() (bool, string) {
		resp, err := cli.Get(ctx, "/village/departed/agt/", clientv3.WithPrefix())
		must(t, err, "reading the markers")
		var left []string
		for _, kv := range resp.Kvs {
			left = append(left, string(kv.Key))
		}
		return len(left) == 0, strings.Join(left, " ")
	})
	for ip, node := range live {
		if v := get("/village/ipam/agt/ips/" + ip); !strings.Contains(v, `"node":"`+node+`"`) {
			t.Errorf("live node %s's LAN address %s: allocation %q, want it held under %s (host name %s)\n%s", node, ip, v, node, host, logs())
		}
	}
	for _, line := range strings.Split(logs(), "\n") {
		if strings.Contains(line, "reclaimed from node") && !strings.Contains(line, "reclaimed from node node3") {
			t.Errorf("a holder other than the departed node3 was reclaimed: %s", line)
		}
	}
}
