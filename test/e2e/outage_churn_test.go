package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
)

// churnState is what pods leave on a node's kernel and disk: the IPAM
// store's files, the links, every route of every table (but the local
// routes of IPv6 link-local addresses, which appear when the kernel's
// duplicate address detection ends, whenever that is), and the iptables
// and nftables rules (iptablesRules, counters left out).
type churnState struct {
	ipam, links, routes, rules string
}

var linkLocal = regexp.MustCompile(`(?m)^local fe80::\S+ dev .*\n`)

func readChurnState(t *testing.T, n *agentNode, ipamDir string) churnState {
	t.Helper()
	return churnState{
		ipam:   strings.Join(files(t, ipamDir), "\n"),
		links:  strings.Join(slices.Sorted(slices.Values(linkNames(testenv.MustIP(t, n.NS, "-o", "link", "show")))), "\n"),
		routes: linkLocal.ReplaceAllString(testenv.MustIP(t, n.NS, "-4", "route", "show", "table", "all")+testenv.MustIP(t, n.NS, "-6", "route", "show", "table", "all"), ""),
		rules:  strings.Join(iptablesRules(t, n.Node), "\n"),
	}
}

// TestAgentKilledDuringPodChurn: on one node (etcd registry, macspoofchk
// and masquerade on, so every pod has a rule of its own), 60 pods are
// added and deleted through libcni by 4 workers (each pod living across the
// next ADD) while villaged is killed with SIGKILL and started again, at
// least 8 times: every other time once it is up, the others while it
// starts. Every ADD and DEL succeeds (the plugins need no running agent). Afterwards, with the agent
// back and a full pass run, the node is exactly as it was with only the
// one pod that lived through the churn: no IPAM file, link, route,
// nftables or iptables rule is left over, `villaged status` reports no
// orphan, and the survivor still answers.
//
// In test/e2e rather than the kubelet cluster: the kernel objects and the
// store are the same (the plugins and villaged binaries, a real netns per
// pod, real netfilter), each pod costs a few milliseconds instead of a
// sandbox, and the agent is killed at will, not through a DaemonSet's
// back-off.
func TestAgentKilledDuringPodChurn(t *testing.T) {
	const pods, workers, minKills = 60, 4, 8
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", agentEtcdIP+"/24")
	lab := &agentLab{t: t, host: host, etcd: etcdtest.StartIn(t, host, agentEtcdIP)}
	var ipamDir string
	lab.setup(lan, func(dataDir string) string {
		ipamDir = dataDir
		return agentConflist("vxlan", dataDir, "", `,"macspoofchk":true`)
	}, 1)
	n := lab.nodes[0]
	lab.start(n)
	waitFor(t, 20*time.Second, "node1 publishes its leased subnet", func() (bool, string) {
		return n.subnet(t) != "", n.log.String()
	})
	survivor := n.NewPod()
	r := n.MustAdd(lab.list, survivor)
	gw := strings.TrimSuffix(n.subnet(t), "0/24") + "1"
	must(t, testenv.Ping(survivor.NS, gw, 1), "the survivor pod -> its gateway %s", gw)
	before := readChurnState(t, n, ipamDir)

	// The killer: every other villaged is killed once it is up (its
	// loop has reconciled and kept the netfilter rules), the others while
	// they start (two pods after the start).
	agentUp := func() bool {
		body, code := httpGetIn(t, n.NS, "http://127.0.0.1:9696/metrics")
		return code == 200 && metricAtLeast(body, "village_reconcile_runs_total", 1) && metricAtLeast(body, "village_netfilter_passes_total", 1)
	}
	var done, kills, killedUp atomic.Int32
	stopKiller := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for round := 0; ; round++ {
			from := done.Load()
			for ready := false; !ready; {
				select {
				case <-stopKiller:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if round%2 == 0 {
					ready = agentUp()
				} else {
					ready = done.Load() >= from+2
				}
			}
			_ = n.stop(t, syscall.SIGKILL)
			kills.Add(1)
			if round%2 == 0 {
				killedUp.Add(1)
			}
			lab.start(n)
		}
	}()
	// The churn: each worker adds a pod and deletes the one it added
	// before (so pods live across kills too), until at least pods pods
	// and minKills kills; then it deletes its last.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	fail := func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
	var next atomic.Int32
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var prev *Pod
			del := func(p *Pod) {
				if err := n.Del(lab.list, p); err != nil {
					fail(fmt.Errorf("DEL of pod %s: %w", p.ID, err))
				}
				p.NS.Close()
				done.Add(1)
			}
			for int(next.Add(1)) <= pods || kills.Load() < minKills {
				p := n.NewPod()
				if _, err := n.Add(lab.list, p); err != nil {
					fail(fmt.Errorf("ADD of pod %s: %w", p.ID, err))
				}
				if prev != nil {
					del(prev)
				}
				prev = p
			}
			if prev != nil {
				del(prev)
			}
		}()
	}
	wg.Wait()
	close(stopKiller)
	<-killerDone
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("FIGURE: %d pods added and deleted by %d workers in %s, villaged killed (SIGKILL) and restarted %d times meanwhile (%d of them once up, the others while starting)",
		done.Load(), workers, time.Since(start).Round(time.Millisecond), kills.Load(), killedUp.Load())

	// The agent back and settled: the last one has reconciled and kept
	// the netfilter rules (its counters start at 0).
	waitFor(t, 60*time.Second, "the last villaged reconciles and keeps the netfilter rules", func() (bool, string) {
		body, code := httpGetIn(t, n.NS, "http://127.0.0.1:9696/metrics")
		return code == 200 && metricValue(body, "village_netfilter_passes_total") >= 1 &&
			metricValue(body, "village_reconcile_runs_total") >= 1, body
	})
	var after churnState
	waitFor(t, 60*time.Second, "the node is as it was before the churn", func() (bool, string) {
		after = readChurnState(t, n, ipamDir)
		return after == before, diffState(before, after)
	})
	out, err := n.villaged(t, "status", "--conf", lab.conf, "--node-name", n.name, "--run-dir", n.runDir).CombinedOutput()
	if err != nil || strings.Contains(string(out), "orphan") {
		t.Fatalf("villaged status after the churn: %v\n%s", err, out)
	}
	must(t, testenv.Ping(survivor.NS, gw, 1), "the survivor pod (%s) -> its gateway after the churn", r.IPs[0].Address.IP)
	must(t, n.Check(lab.list, survivor), "CHECK of the survivor pod after the churn")
}

// diffState names the parts of a node's state that differ.
func diffState(a, b churnState) string {
	var out []string
	for _, f := range []struct{ name, a, b string }{
		{"IPAM store", a.ipam, b.ipam}, {"links", a.links, b.links}, {"routes", a.routes, b.routes},
		{"iptables and nftables rules", a.rules, b.rules},
	} {
		if f.a != f.b {
			out = append(out, fmt.Sprintf("%s before:\n%s\n%s after:\n%s", f.name, f.a, f.name, f.b))
		}
	}
	return strings.Join(out, "\n")
}
