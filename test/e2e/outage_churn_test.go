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
// added and deleted through libcni by 4 workers while villaged is killed
// with SIGKILL and started again after every 8 pods. Every ADD and DEL
// succeeds (the plugins need no running agent). Afterwards, with the agent
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
	const pods, workers, killEvery = 60, 4, 8
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

	var done atomic.Int32
	kills := 0
	stopKiller := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		next := int32(killEvery)
		for {
			select {
			case <-stopKiller:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if done.Load() < next {
				continue
			}
			next += killEvery
			_ = n.stop(t, syscall.SIGKILL)
			kills++
			lab.start(n)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	work := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				p := n.NewPod()
				if _, err := n.Add(lab.list, p); err != nil {
					errs <- fmt.Errorf("ADD of pod %d: %w", i, err)
				}
				if err := n.Del(lab.list, p); err != nil {
					errs <- fmt.Errorf("DEL of pod %d: %w", i, err)
				}
				p.NS.Close()
				done.Add(1)
			}
		}()
	}
	start := time.Now()
	for i := range pods {
		work <- i
	}
	close(work)
	wg.Wait()
	close(stopKiller)
	<-killerDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("FIGURE: %d pods added and deleted by %d workers in %s, villaged killed (SIGKILL) and restarted %d times meanwhile",
		pods, workers, time.Since(start).Round(time.Millisecond), kills)
	if kills < pods/killEvery-1 {
		t.Fatalf("villaged was killed %d times, want at least %d", kills, pods/killEvery-1)
	}

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
