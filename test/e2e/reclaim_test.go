package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/testenv"
)

// reclaimLAN is the lab's LAN pool: in the registry's etcd, under the
// default prefix (the agent must fill it in as village-ipam does).
const reclaimLAN = `"store":{"type":"etcd","endpoints":["http://` + agentEtcdIP + `:2379"]},
	"ranges":[[{"subnet":"192.168.79.0/24","rangeStart":"192.168.79.200","rangeEnd":"192.168.79.220"}]]`

// lanClaim takes a LAN address for container id through the real IPAM
// plugin (etcd store) run on node n, recorded as made by node name.
func lanClaim(t *testing.T, n *agentNode, id string) string {
	t.Helper()
	stdin := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"agt","ipam":{"type":"village-ipam",%s}}`,
		strings.Replace(reclaimLAN, `:2379"]`, `:2379"],"nodeName":"`+n.name+`"`, 1))
	out := n.Exec(testenv.Call{Bin: "village-ipam", Command: "ADD", ContainerID: id, IfName: "net1", Netns: "/x", Stdin: []byte(stdin)})
	if out.ExitCode != 0 {
		t.Fatalf("LAN claim on %s: %s %s", n.name, out.Stdout, out.Stderr)
	}
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out.Stdout, &r); err != nil || len(r.IPs) != 1 {
		t.Fatalf("LAN claim result: %v %s", err, out.Stdout)
	}
	return strings.Split(r.IPs[0].Address, "/")[0]
}

// TestReclaimDepartedNode: node3's agent is killed and its record expires;
// after the grace period (reclaimAfter 2 s) one surviving agent, once,
// releases node3's subnet lease and its LAN pool allocations in one etcd
// transaction. The live nodes' leases and allocations stay, and a departure
// marker planted for a live node is cleared instead of acted on.
func TestReclaimDepartedNode(t *testing.T) {
	lab := newAgentLab(t, "vxlan", `,"reclaimAfter":2`,
		`,"macvlan":{"master":"lan0","ifName":"net1","ipam":{"type":"village-ipam",`+reclaimLAN+`}}`)
	subnets := lab.startAll()
	n1, n3 := lab.nodes[0], lab.nodes[2]
	ip1 := lanClaim(t, n1, "pod-on-node1")
	ip3 := lanClaim(t, n3, "pod-on-node3")
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
	count := func(prefix string) int64 {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		must(t, err, "reading %s", prefix)
		return resp.Count
	}
	lease1, lease3 := "/village/subnets/agt/"+subnets[0], "/village/subnets/agt/"+subnets[2]
	alloc1, alloc3 := "/village/ipam/agt/ips/"+ip1, "/village/ipam/agt/ips/"+ip3
	for key, want := range map[string]string{lease1: "node1", lease3: "node3", alloc1: `"node":"node1"`, alloc3: `"node":"node3"`} {
		if v := get(key); !strings.Contains(v, want) {
			t.Fatalf("%s = %q before the departure, want %s", key, v, want)
		}
	}
	// A marker for a node that is alive, as old as can be: never acted on.
	_, err := cli.Put(ctx, "/village/departed/agt/node1", "2000-01-01T00:00:00Z")
	must(t, err, "planting a marker")

	_ = n3.stop(t, syscall.SIGKILL)
	killed := time.Now()
	waitFor(t, 90*time.Second, "a survivor reclaims node3's subnet lease", func() (bool, string) {
		return get(lease3) == "", n1.log.String() + lab.nodes[1].log.String()
	})
	t.Logf("FIGURE: node3's subnet lease reclaimed %s after its agent was killed (TTL %ds, reclaimAfter 2s, period 10s)", time.Since(killed).Round(time.Second), agentTTL)
	if v := get(alloc3); v != "" {
		t.Fatalf("node3's LAN allocation %s survived the reclaim: %s", ip3, v)
	}
	if n := count("/village/ipam/agt/owners/pod-on-node3/"); n != 0 {
		t.Fatalf("node3's LAN owner index keys survived: %d", n)
	}
	if get(lease1) != "node1" || !strings.Contains(get(alloc1), `"node":"node1"`) {
		t.Fatalf("a live node lost its lease or LAN allocation: %q %q", get(lease1), get(alloc1))
	}
	// The live node's marker is cleared and the reclaimed node's deleted by
	// the survivors' passes, which need not be the pass that reclaimed; the
	// log line follows the transaction. Wait for both, then count.
	waitFor(t, 60*time.Second, "no departure markers left (the live node's cleared, the reclaimed node's deleted)", func() (bool, string) {
		n := count("/village/departed/agt/")
		return n == 0, fmt.Sprintf("%d markers left", n)
	})
	logs := func() string { return n1.log.String() + lab.nodes[1].log.String() }
	waitFor(t, 30*time.Second, "a survivor logs the reclaim", func() (bool, string) {
		return strings.Contains(logs(), "reclaimed from node node3"), logs()
	})
	reclaims := strings.Count(logs(), "reclaimed from node node3")
	if reclaims != 1 {
		t.Fatalf("node3 was reclaimed %d times (want exactly once):\n%s\n%s", reclaims, n1.log.String(), lab.nodes[1].log.String())
	}
	if strings.Contains(n1.log.String()+lab.nodes[1].log.String(), "reclaimed from node node1") {
		t.Fatal("a live node was reclaimed")
	}
}
