package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/testenv"
)

// outageMinute is how long the outage tests keep a control plane away
// (issue 38: "for a minute").
const outageMinute = time.Minute

// pingStats pings dst from inside n every 0.5 s until ctx is done (then
// ping gets SIGINT and prints its statistics) or for d when d > 0 (ping's
// own -w deadline), and returns the packets sent and answered.
func pingStats(ctx context.Context, n ns.NetNS, dst string, d time.Duration) (sent, answered int, err error) {
	args := []string{"netns", "exec", filepath.Base(n.Path()), "ping", "-n", "-q", "-i", "0.5", "-W", "1"}
	if d > 0 {
		args = append(args, "-w", strconv.Itoa(int(d.Seconds())))
	}
	cmd := exec.CommandContext(ctx, "ip", append(args, dst)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	out, _ := cmd.CombinedOutput()
	m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) (packets )?received`).FindStringSubmatch(string(out))
	if m == nil {
		return 0, 0, fmt.Errorf("ping %s: no statistics in %q", dst, out)
	}
	sent, _ = strconv.Atoi(m[1])
	answered, _ = strconv.Atoi(m[2])
	return sent, answered, nil
}

// probe is one pinged path of an outage test.
type probe struct {
	what     string
	from     ns.NetNS
	dst      string
	sent, ok int
	err      error
}

// pingAll runs every probe's pingStats at once (for d, or until ctx is
// done when d is 0) and returns a channel closed when all have finished.
func pingAll(ctx context.Context, probes []*probe, d time.Duration) <-chan struct{} {
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.sent, p.ok, p.err = pingStats(ctx, p.from, p.dst, d)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// TestEtcdRegistryOutage: the registry's etcd is unreachable for a minute
// (its namespace drops every packet to port 2379 arriving over the LAN, so
// the agents' connections hang as on a partition) under three agents
// (vxlan, TTL 5 s, so every node record expires during the outage, and
// reclaimAfter 10 s, so a wrong reclaim would happen within the test).
// During the minute, pods ping across every pair of nodes and every ping is
// answered: the agents keep their routes. After it: every node registers
// again, and while they do, the pings go on being answered: no agent
// takes its peers' records, expired with its own, for departures (it
// holds them, pkg/agent/outage.go), so no route is removed. No agent
// exited, each node keeps its subnet lease (nothing is reclaimed), and a
// node joining after the outage is routed by every node and reached by
// their pods.
func TestEtcdRegistryOutage(t *testing.T) {
	lab := newAgentLab(t, "vxlan", `,"reclaimAfter":10`)
	subnets := lab.startAll()
	pods := lab.podsPing(subnets)
	addr := func(i int) string {
		m := regexp.MustCompile(`inet (\S+)/`).FindStringSubmatch(podAddrs(t, pods[i], "eth0"))
		if m == nil {
			t.Fatalf("no IPv4 address on the pod of %s", lab.nodes[i].name)
		}
		return m[1]
	}
	var probes []*probe
	for i := range pods {
		for j := range pods {
			if i != j {
				probes = append(probes, &probe{what: lab.nodes[i].name + " -> " + lab.nodes[j].name, from: pods[i].NS, dst: addr(j)})
			}
		}
	}
	cli := lab.etcd.ClientIn(t, lab.host)
	leases := func() map[string]string {
		m := map[string]string{}
		for _, s := range subnets {
			resp, err := cli.Get(t.Context(), "/village/subnets/agt/"+s)
			must(t, err, "reading the lease of %s", s)
			if len(resp.Kvs) == 1 {
				m[s] = string(resp.Kvs[0].Value)
			} else {
				m[s] = ""
			}
		}
		return m
	}

	// The cut: etcd's namespace drops what reaches port 2379 from the LAN
	// (the test's own client comes over loopback and is left alone).
	testenv.Nft(t, lab.host, "add", "table", "inet", "outage")
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "exec", filepath.Base(lab.host.Path()), "nft", "delete", "table", "inet", "outage").Run()
	})
	testenv.Nft(t, lab.host, "add", "chain", "inet", "outage", "in", "{ type filter hook input priority -10 ; }")
	testenv.Nft(t, lab.host, "add", "rule", "inet", "outage", "in", "iifname", "eth0", "tcp", "dport", "2379", "counter", "drop")
	testenv.Nft(t, lab.host, "add", "chain", "inet", "outage", "out", "{ type filter hook output priority -10 ; }")
	testenv.Nft(t, lab.host, "add", "rule", "inet", "outage", "out", "oifname", "eth0", "tcp", "sport", "2379", "counter", "drop")
	cut := time.Now()
	logAt := map[string]int{}
	for _, n := range lab.nodes {
		logAt[n.name] = len(n.log.String())
	}
	<-pingAll(t.Context(), probes, outageMinute)
	dropped := testenv.Nft(t, lab.host, "list", "chain", "inet", "outage", "in")
	// From the moment etcd is back until every agent has recovered,
	// the same pings run again: what the recovery costs.
	after := make([]*probe, len(probes))
	for i, p := range probes {
		after[i] = &probe{what: p.what, from: p.from, dst: p.dst}
	}
	testenv.Nft(t, lab.host, "delete", "table", "inet", "outage")
	restored := time.Now()
	stopPings, cancelPings := context.WithCancel(t.Context())
	defer cancelPings()
	pingsDone := pingAll(stopPings, after, 0)
	t.Logf("etcd unreachable for %s; the drop rule: %s", restored.Sub(cut).Round(time.Millisecond),
		regexp.MustCompile(`counter packets \d+ bytes \d+`).FindString(dropped))
	for _, p := range probes {
		t.Logf("FIGURE: during the etcd outage, pod %s: %d pings sent, %d answered", p.what, p.sent, p.ok)
		if p.err != nil || p.sent == 0 || p.ok != p.sent {
			t.Errorf("pod %s during the etcd outage: %d of %d pings answered (%v)", p.what, p.ok, p.sent, p.err)
		}
	}
	if !strings.Contains(dropped, "counter packets") || strings.Contains(dropped, "counter packets 0 ") {
		t.Fatalf("the cut dropped nothing: the agents did not try etcd during the outage?\n%s", dropped)
	}
	for _, n := range lab.nodes {
		if !strings.Contains(n.log.String(), "keeping node "+n.name+" registered") {
			t.Errorf("%s's agent logged no failed renewal: was etcd really away?\n%s", n.name, n.log.String())
		}
	}

	// Recovery: every node registered again under a new lease and
	// routed to the others.
	for i, n := range lab.nodes {
		others := slices.Delete(slices.Clone(subnets), i, i+1)
		waitFor(t, 2*time.Minute, n.name+" registers again after the outage", func() (bool, string) {
			return strings.Contains(n.log.String(), "the lease of node "+n.name+" had expired: registered again"), n.log.String()
		})
		waitFor(t, 2*time.Minute, n.name+" routes to the other nodes after the outage", func() (bool, string) {
			return n.hasRoutes(t, others, nil)
		})
	}
	recovered := time.Since(restored)
	t.Logf("FIGURE: after the etcd outage, every node registered again and routed to the others %s after etcd returned", recovered.Round(time.Millisecond))
	cancelPings()
	<-pingsDone
	for _, p := range after {
		t.Logf("FIGURE: from etcd's return until recovered, pod %s: %d pings sent, %d answered", p.what, p.sent, p.ok)
		if p.err != nil || p.ok != p.sent {
			t.Errorf("pod %s while the agents recovered: %d of %d pings answered (%v)", p.what, p.ok, p.sent, p.err)
		}
	}
	// Every record expired during the outage, but no agent took its
	// peers' expiry for a departure: no route was removed (outage.go).
	for _, n := range lab.nodes {
		since := n.log.String()[logAt[n.name]:]
		if strings.Contains(since, " left (record deleted") || strings.Contains(since, "delete route") {
			t.Errorf("%s removed a peer over the outage:\n%s", n.name, since)
		}
		t.Logf("%s held %d peer removals over the outage", n.name, strings.Count(since, "its routes stay until it registers again"))
	}
	for i := range pods {
		for j := range pods {
			if i != j {
				must(t, testenv.Ping(pods[i].NS, addr(j), 2), "pod on %s -> pod on %s after the outage", lab.nodes[i].name, lab.nodes[j].name)
			}
		}
	}

	// A node joins after the outage: every node routes to it, its pod
	// reaches theirs.
	n4 := lab.addNode()
	lab.start(n4)
	waitFor(t, 30*time.Second, "node4 publishes its leased subnet", func() (bool, string) {
		return n4.subnet(t) != "", n4.log.String()
	})
	s4 := n4.subnet(t)
	if slices.Contains(subnets, s4) {
		t.Fatalf("node4 leased %s, which a node that was there before the outage holds (%v)", s4, subnets)
	}
	for _, n := range lab.nodes[:3] {
		waitFor(t, time.Minute, n.name+" routes to node4, which joined after the outage", func() (bool, string) {
			return n.hasRoutes(t, []string{s4}, nil)
		})
	}
	p4 := n4.NewPod()
	r4 := n4.MustAdd(lab.list, p4)
	for i, p := range pods {
		must(t, testenv.Ping(p.NS, r4.IPs[0].Address.IP.String(), 2), "pod on %s -> pod on node4", lab.nodes[i].name)
	}

	// Nothing was lost: no departure marker is left (an agent that saw
	// the others' records gone before they registered again may have
	// marked them; the marker goes once they are back, and without one
	// nothing can be reclaimed later), no agent exited, every lease is
	// still its node's and nobody reclaimed anything.
	waitFor(t, time.Minute, "no departure marker left after the outage", func() (bool, string) {
		resp, err := cli.Get(t.Context(), "/village/departed/agt/", clientv3.WithPrefix())
		must(t, err, "reading the departure markers")
		return len(resp.Kvs) == 0, fmt.Sprint(resp.Kvs)
	})
	for _, n := range lab.nodes[:3] {
		select {
		case err := <-n.exited:
			t.Fatalf("villaged on %s exited: %v\n%s", n.name, err, n.log.String())
		default:
		}
	}
	for i, s := range subnets {
		if got := leases()[s]; got != lab.nodes[i].name {
			t.Errorf("the lease of %s is %q after the outage, want %s", s, got, lab.nodes[i].name)
		}
		if got := lab.nodes[i].subnet(t); got != s {
			t.Errorf("%s publishes %q after the outage, had %s", lab.nodes[i].name, got, s)
		}
	}
	for _, n := range lab.nodes {
		if strings.Contains(n.log.String(), "reclaimed from node") {
			t.Errorf("%s reclaimed a node after the etcd outage:\n%s", n.name, n.log.String())
		}
	}
}
