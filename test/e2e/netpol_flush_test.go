package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/table"
)

// flushRuleset runs on TestNetworkPolicyAgents' lab; it restarts n's
// agent with --period 1h (and with the default again at its end): no
// repair timer fires meanwhile, so whatever puts the tables back is the
// agent's nf_tables notifications (pkg/nftwatch, the controller's Kick,
// masq's repair). The whole lab does not run with 1h: its start-up (a
// Node annotation refused until the agent is confined) is retried by the
// timer. web is isolated (deny-web), local is
// selected by no policy; far is on another node.
//
//   - `nft delete table` of the policy and pending tables, then `nft flush
//     ruleset`: every table of n (policy, pending, masquerade) is back,
//     by condition, well within the hour; the gap is logged; web is
//     isolated again (a prober from far never gets through once the
//     tables are back, while its control, local, answers) and `villaged
//     status` says the kernel matches.
//   - a pod added before a flush and not compiled (its Pod unpublished):
//     its pending mark, which went with the table, is written back by the
//     repair, so no probe from far reaches it after the tables are back;
//     published, it is reachable.
//   - a pod added right after a flush, while n's agent is frozen (SIGSTOP:
//     alive, its ready lock held, its repair not yet run), in a namespace
//     with policies: the ADD marks it pending although the pending table
//     was gone, so it is unreachable until the agent has compiled it, and
//     reachable after (no policy selects it).
func (l *npLab) flushRuleset(n *agentNode, far, web, local *npPod) {
	t := l.t
	l.restartWithPeriod(n, "1h")
	defer func() {
		if !t.Failed() { // a failed test stops its agents as it ends
			l.restartWithPeriod(n, "")
		}
	}()
	want := l.tables(n)
	var pending []netip.Addr
	for _, tb := range []string{table.PolicyTable("agt"), table.PendingTable("agt")} {
		if !slices.Contains(want, "table inet "+tb) {
			t.Fatalf("%s has no table inet %s before the flush: %v", n.name, tb, want)
		}
	}
	removals := []struct {
		name string
		args [][]string
	}{
		{"nft delete table (policy and pending)", [][]string{
			{"delete", "table", "inet", table.PolicyTable("agt")}, {"delete", "table", "inet", table.PendingTable("agt")}}},
		{"nft flush ruleset", [][]string{{"flush", "ruleset"}}},
	}
	for _, r := range removals {
		for _, a := range r.args {
			inNS(t, n.NS, append([]string{"nft"}, a...)...)
		}
		gap := l.waitTables(n, want, r.name)
		t.Logf("%s: every table of %s back %s after the removal (period 1h: not the timer)", r.name, n.name, gap.Round(time.Millisecond))
		l.reach(far, web, 80, false)
		pr := startProber(far.pod.NS, web.ip, target{local.ip, 80})
		pr.waitTries(t, 2*probeWorkers)
		if tries, through := pr.stop(); through != 0 {
			t.Fatalf("after %s: %d of %d probes reached the isolated pod web: %s", r.name, through, tries, pr)
		}
		l.statusLine(n, "kernel matches")
	}

	// a pod added before a flush and not compiled yet (its Pod is not
	// published, so the informers never see it): its pending mark goes
	// with the table, and the repair writes it back with the table (the
	// agent followed the mark's notification), so it stays unreachable
	// through the reload until its own compile
	early := l.pod(n, "early", false)
	l.reach(far, early, 80, false)
	inNS(t, n.NS, "nft", "flush", "ruleset")
	l.waitTables(n, want, "nft flush ruleset with a pod pending")
	must(t, testenv.InNS(n.NS, func() (err error) { pending, err = table.Pending("agt"); return err }), "listing pending")
	if !slices.Contains(pending, netip.MustParseAddr(early.ip)) {
		t.Fatalf("after nft flush ruleset and the repair, the pending pod %s is not marked (marks %v)", early.ip, pending)
	}
	pr := startProber(far.pod.NS, early.ip, target{local.ip, 80})
	pr.waitTries(t, 2*probeWorkers)
	if tries, through := pr.stop(); through != 0 {
		t.Fatalf("after nft flush ruleset: %d of %d probes reached the pending pod early: %s", through, tries, pr)
	}
	l.publishPod(n, early)
	waitFor(t, 60*time.Second, "the published pod pending through the flush is reachable", func() (bool, string) {
		err := dialFrom(far.pod.NS, early.ip, 80)
		return err == nil, fmt.Sprint(err)
	})

	// a pod added in the moment between a flush and the agent's repair
	agent := n.cmd.Process
	must(t, agent.Signal(syscall.SIGSTOP), "freezing villaged on %s", n.name)
	defer agent.Signal(syscall.SIGCONT) // also when the test fails, so it can stop
	inNS(t, n.NS, "nft", "flush", "ruleset")
	p := l.pod(n, "flushed", false)
	must(t, testenv.InNS(n.NS, func() (err error) { pending, err = table.Pending("agt"); return err }), "listing pending")
	must(t, dialFrom(far.pod.NS, local.ip, 80), "control: far -> local with the ruleset flushed")
	if err := dialFrom(far.pod.NS, p.ip, 80); err == nil || !isTimeout(err) {
		t.Fatalf("far -> pod %s added right after a flush (pending marks %v): %v, want no answer", p.ip, pending, err)
	}
	must(t, agent.Signal(syscall.SIGCONT), "thawing villaged on %s", n.name)
	l.waitTables(n, want, "the thawed agent's repair")
	l.reach(far, p, 80, false) // not compiled yet: still pending
	l.reach(far, web, 80, false)
	l.publishPod(n, p)
	waitFor(t, 60*time.Second, "the published pod added after the flush is reachable", func() (bool, string) {
		err := dialFrom(far.pod.NS, p.ip, 80)
		return err == nil, fmt.Sprint(err)
	})
}

// restartWithPeriod restarts n's agent with --period period ("": the
// default) and waits for its compile to be in the kernel.
func (l *npLab) restartWithPeriod(n *agentNode, period string) {
	must(l.t, n.stop(l.t, syscall.SIGTERM), "stopping villaged on %s", n.name)
	l.period = period
	l.start(n)
	l.statusLine(n, "kernel matches")
}

// tables lists n's nftables tables ("table <family> <name>"), sorted.
func (l *npLab) tables(n *agentNode) []string {
	var tables []string
	for _, line := range strings.Split(inNS(l.t, n.NS, "nft", "list", "tables"), "\n") {
		if strings.HasPrefix(line, "table ") {
			tables = append(tables, strings.TrimSpace(line))
		}
	}
	slices.Sort(tables)
	return tables
}

// waitTables waits until n has every table of want again, and returns how
// long that took.
func (l *npLab) waitTables(n *agentNode, want []string, what string) time.Duration {
	return waitFor(l.t, 60*time.Second, what+": the tables of "+n.name+" back", func() (bool, string) {
		have := l.tables(n)
		for _, w := range want {
			if !slices.Contains(have, w) {
				return false, fmt.Sprintf("missing %s; have %v\n%s", w, have, n.log.String())
			}
		}
		return true, ""
	})
}
