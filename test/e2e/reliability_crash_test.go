package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netsetup"
)

// proc is a plugin process started in a node namespace, in its own process
// group so that the IPAM plugin it execs can be found (and waited for) after
// the plugin itself is killed.
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan error
}

func startPlugin(t *testing.T, n *Node, c testenv.Call) *proc {
	t.Helper()
	if c.Path == "" {
		c.Path = testenv.CNIPath(t)
	}
	if !strings.Contains(c.Bin, "/") {
		c.Bin = filepath.Join(testenv.Bins(t), c.Bin)
	}
	p := &proc{cmd: exec.Command(c.Bin), done: make(chan error, 1)}
	p.cmd.Env = append([]string{
		"CNI_COMMAND=" + c.Command, "CNI_CONTAINERID=" + c.ContainerID, "CNI_NETNS=" + c.Netns,
		"CNI_IFNAME=" + c.IfName, "CNI_ARGS=" + c.Args, "CNI_PATH=" + c.Path, "PATH=" + os.Getenv("PATH"),
	}, c.Env...)
	p.cmd.Stdin = bytes.NewReader(c.Stdin)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := testenv.InNS(n.NS, p.cmd.Start); err != nil {
		t.Fatalf("starting %s: %v", c.Bin, err)
	}
	pgid := p.cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	go func() { p.done <- p.cmd.Wait() }()
	return p
}

type killMode int

const (
	// killPlugin kills only the plugin: the IPAM child it may be running
	// carries on, orphaned, as it does when a runtime's deadline kills a
	// plugin.
	killPlugin killMode = iota
	// killGroup kills the IPAM plugin too, at whatever point of its own
	// store writes it had reached.
	killGroup
	// killPluginThenGroup kills the plugin, then its IPAM child (a wrapper
	// that holds IPAM's answer, the allocation already on disk, and would
	// have nowhere to print it).
	killPluginThenGroup
)

// kill SIGKILLs the plugin as mode says and waits until every process of
// its group has gone, so that the runtime's next verb does not race with a
// still-running orphan.
func (p *proc) kill(t *testing.T, mode killMode) (killed bool) {
	t.Helper()
	pid := p.cmd.Process.Pid
	if mode == killGroup {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	} else {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	err := <-p.done
	var ee *exec.ExitError
	killed = errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()
	if mode == killPluginThenGroup {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for groupAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still alive 30s after its plugin was killed", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return killed
}

// groupAlive reports whether a process of group pgid is still running.
// Zombies do not count: orphans are reaped by PID 1, which may take its time.
func groupAlive(pgid int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}

// holdIPAM writes a village-ipam wrapper that runs the real plugin and, on
// ADD, reports its pid in $VILLAGE_TEST_HOLD and sleeps before handing the
// result back: while it sleeps the allocation is on disk and village has not
// touched a link. No test hook in production code is involved.
func holdIPAM(t *testing.T, dir string) string {
	t.Helper()
	real := filepath.Join(testenv.Bins(t), "village-ipam")
	script := fmt.Sprintf(`#!/bin/sh
out=$(%s); rc=$?
if [ "$CNI_COMMAND" = ADD ] && [ -n "$VILLAGE_TEST_HOLD" ]; then
	echo $$ > "$VILLAGE_TEST_HOLD.tmp" && mv "$VILLAGE_TEST_HOLD.tmp" "$VILLAGE_TEST_HOLD"
	sleep "${VILLAGE_TEST_HOLD_SECS:-60}"
fi
printf '%%s' "$out"
exit $rc
`, real)
	return execDir(t, filepath.Join(dir, "hold-bin"), map[string][]byte{"village-ipam": []byte(script)}) + ":" + testenv.CNIPath(t)
}

// pluginStdin is what libcni gives the first plugin of l: its config with
// the list's name and cniVersion injected.
func pluginStdin(t *testing.T, l *libcni.NetworkConfigList) []byte {
	t.Helper()
	c, err := libcni.InjectConf(l.Plugins[0], map[string]any{"name": l.Name, "cniVersion": l.CNIVersion})
	must(t, err, "inject")
	return c.Bytes
}

// removeNS does what a runtime does to a sandbox it gives up on: the
// namespace goes away (the test's handle is closed and the bind mount
// removed), taking the pod's end of its veth, and so the host end, with it.
func removeNS(t *testing.T, p *Pod) {
	t.Helper()
	path := p.NS.Path()
	must(t, p.NS.Close(), "closing %s", path)
	sh(t, "ip", "netns", "del", filepath.Base(path))
}

// waitFile waits until the IPAM wrapper of the ADD p runs reports, by
// writing path, that it holds its answer.
func waitFile(t *testing.T, path string, p *proc) {
	t.Helper()
	waitWhileRunning(t, p, "the IPAM wrapper wrote "+path, func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
}

// waitEth0 waits until the ADD p runs has made the pod's eth0 (village makes
// the links while the IPAM plugin runs).
func waitEth0(t *testing.T, p *Pod, pr *proc) {
	t.Helper()
	waitWhileRunning(t, pr, "village made eth0 while IPAM held its answer", func() bool {
		return strings.Contains(testenv.MustIP(t, p.NS, "-o", "link"), "eth0")
	})
}

// waitWhileRunning polls done for up to 20 s while the plugin p runs; it
// fails the test when p ends first or the time is up, naming what.
func waitWhileRunning(t *testing.T, p *proc, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !done() {
		select {
		case err := <-p.done:
			t.Fatalf("plugin ended (%v) before %s: %s %s", err, what, p.stdout.String(), p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within 20 s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ownersOf reads the reservation files of the data dir: ip -> "id/ifname".
func ownersOf(t *testing.T, data string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range ipFiles(t, data) {
		b, err := os.ReadFile(filepath.Join(data, f))
		must(t, err, "read %s", f)
		id, ifn, _ := strings.Cut(string(b), "\r\n")
		out[filepath.Base(f)] = id + "/" + ifn
	}
	return out
}

// TestCrashDuringAdd SIGKILLs the real village binary during ADD: at random
// moments, exactly after IPAM answered and before any link exists, and at a
// random moment of link setup right after IPAM answered. The runtime then
// retries ADD for some (they must succeed and become normal pods), DELs
// others, and forgets the rest (their namespaces go away and GC runs with
// the survivors' attachments). Afterwards exactly the survivors hold
// addresses and veths, and each still passes CHECK.
func TestCrashDuringAdd(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	path := holdIPAM(t, n.Dir)
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"crash","plugins":[{"type":"village","bridge":"crash0","isGateway":true,"ipMasq":true,
		"clusterCIDR":"10.61.0.0/16",
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.61.0.0/26"}],[{"subnet":"fd61::/64"}]],
		"routes":[{"dst":"0.0.0.0/0"}]}}]}`, data)
	l := ConfList(t, conf)
	stdin := pluginStdin(t, l)

	var survivors, crashed []*Pod
	for range 3 {
		p := n.NewPod()
		n.MustAdd(l, p)
		survivors = append(survivors, p)
	}
	type kill struct {
		pod  *Pod
		how  string
		died bool // the process was killed (not finished first)
	}
	var kills []kill
	start := func(p *Pod, env ...string) *proc {
		return startPlugin(t, n, testenv.Call{Bin: "village", Command: "ADD", ContainerID: p.ID, Netns: p.NS.Path(),
			IfName: "eth0", Path: path, Stdin: stdin, Env: env})
	}
	// How long an ADD takes here, in all and after IPAM answered, measured
	// on two uninterrupted ADDs (they become survivors): kills land inside.
	var whole, linkPart time.Duration
	{
		p := n.NewPod()
		t0 := time.Now()
		pr := start(p)
		if err := <-pr.done; err != nil {
			t.Fatalf("uninterrupted ADD: %v %s", err, pr.stdout.String())
		}
		whole = time.Since(t0)
		q := n.NewPod()
		hold := filepath.Join(n.Dir, "hold-"+q.ID)
		pr = start(q, "VILLAGE_TEST_HOLD="+hold, "VILLAGE_TEST_HOLD_SECS=0")
		waitFile(t, hold, pr)
		t1 := time.Now()
		if err := <-pr.done; err != nil {
			t.Fatalf("uninterrupted ADD: %v %s", err, pr.stdout.String())
		}
		linkPart = time.Since(t1)
		// Repeated through libcni (ADD is idempotent) so that its cache
		// holds the result CHECK needs.
		n.MustAdd(l, p)
		n.MustAdd(l, q)
		survivors = append(survivors, p, q)
		t.Logf("an ADD takes %s, %s of it after IPAM answered", whole, linkPart)
	}
	record := func(p *Pod, how string, died bool) { kills = append(kills, kill{p, how, died}) }
	// 1. Random moments of the whole ADD; every other one kills the IPAM
	// plugin too, in the middle of its own store writes.
	killMidway(t, "random", 16, whole, func(i int) (*Pod, *proc, func(*proc) bool) {
		p := n.NewPod()
		return p, start(p), func(pr *proc) bool { return pr.kill(t, killMode(i%2)) }
	}, record)
	// 2. The addresses are claimed, the links made while the IPAM plugin
	// runs, and the wrapper holds IPAM's answer: eth0 exists but has no
	// address yet when village is killed.
	for i := range 4 {
		p := n.NewPod()
		hold := filepath.Join(n.Dir, "hold-"+p.ID)
		pr := start(p, "VILLAGE_TEST_HOLD="+hold)
		waitFile(t, hold, pr)
		waitEth0(t, p, pr)
		if got := testenv.MustIP(t, p.NS, "-o", "addr", "show", "dev", "eth0"); strings.Contains(got, "inet ") {
			t.Fatalf("eth0 has an address while IPAM still holds its answer: %s", got)
		}
		kills = append(kills, kill{p, fmt.Sprintf("links made, IPAM held #%d", i), pr.kill(t, killPluginThenGroup)})
		if !kills[len(kills)-1].died {
			t.Fatalf("village was not killed while IPAM held: %s %s", pr.stdout.String(), pr.stderr.String())
		}
	}
	// 3. In link setup: IPAM answers at once, village is killed at a random
	// moment of the rest.
	killMidway(t, "link setup", 8, linkPart, func(int) (*Pod, *proc, func(*proc) bool) {
		p := n.NewPod()
		hold := filepath.Join(n.Dir, "hold-"+p.ID)
		pr := start(p, "VILLAGE_TEST_HOLD="+hold, "VILLAGE_TEST_HOLD_SECS=0")
		waitFile(t, hold, pr)
		return p, pr, func(pr *proc) bool { return pr.kill(t, killPlugin) }
	}, record)
	died := 0
	for _, k := range kills {
		if k.died {
			died++
		}
	}
	t.Logf("%d ADDs started, %d killed mid-way, %d finished before the kill", len(kills), died, len(kills)-died)

	// The runtime's recovery: retry ADD for every third, DEL for the next,
	// forget the rest (namespace removed, GC later).
	var forgotten []*Pod
	for i, k := range kills {
		switch i % 3 {
		case 0:
			if _, err := n.Add(l, k.pod); err != nil {
				t.Fatalf("ADD retried after a kill (%s): %v", k.how, err)
			}
			survivors = append(survivors, k.pod)
		case 1:
			out := n.Exec(testenv.Call{Bin: "village", Command: "DEL", ContainerID: k.pod.ID, Netns: k.pod.NS.Path(), IfName: "eth0", Stdin: stdin})
			if out.ExitCode != 0 {
				t.Fatalf("DEL after a kill (%s): %s %s", k.how, out.Stdout, out.Stderr)
			}
			crashed = append(crashed, k.pod)
		default:
			removeNS(t, k.pod)
			forgotten = append(forgotten, k.pod)
		}
	}
	must(t, n.GC(l, survivors...), "GC with the survivors")

	// Exactly the survivors' state.
	want := map[string]bool{}
	var wantVeths []string
	for _, p := range survivors {
		want[p.ID+"/eth0"] = true
		wantVeths = append(wantVeths, netsetup.HostVethName(p.ID, "eth0"))
	}
	owners := ownersOf(t, data)
	held := map[string]int{}
	for ip, o := range owners {
		if !want[o] {
			t.Errorf("address %s still held by %s, which is not a survivor", ip, o)
		}
		held[o]++
	}
	for o := range want {
		if held[o] != 2 {
			t.Errorf("survivor %s holds %d addresses, want 2 (v4 and v6)", o, held[o])
		}
	}
	slices.Sort(wantVeths)
	var veths []string
	waitStart := time.Now()
	// The kernel tears a removed namespace (and the veths in it) down
	// asynchronously, in a work queue that a loaded machine can hold up for
	// long: wait for it, returning as soon as the veths are the survivors'
	// (the bound only guards against a hang).
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		veths = linkNames(testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth"))
		slices.Sort(veths)
		if slices.Equal(veths, wantVeths) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("namespace teardown took %s", time.Since(waitStart).Round(time.Millisecond))
	if !slices.Equal(veths, wantVeths) {
		t.Errorf("veths on the node %v, want exactly the survivors' %v", veths, wantVeths)
	}
	for _, p := range crashed {
		if got := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(got, "eth0") {
			t.Errorf("DEL after a crash left eth0 in %s: %s", p.ID, got)
		}
	}
	for _, p := range survivors {
		if err := n.Check(l, p); err != nil {
			t.Errorf("CHECK of survivor %s: %v", p.ID, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// And the released addresses are usable: DEL everyone, fill the /26.
	noneLeft(t, data, "DEL of every survivor", func() {
		for _, p := range survivors {
			must(t, n.Del(l, p), "DEL %s", p.ID)
		}
	})
	ipamConf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"crash","ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.61.0.0/26"}]]}}`, data))
	for i := range 61 { // .2-.62
		out := n.Exec(testenv.Call{Bin: "village-ipam", Command: "ADD", ContainerID: fmt.Sprintf("fill-%d", i), IfName: "eth0",
			Netns: survivors[0].NS.Path(), Stdin: ipamConf})
		if out.ExitCode != 0 {
			t.Fatalf("fill %d after the crashes: %s", i, out.Stdout)
		}
	}
	t.Logf("%d survivors, %d DELed after a crash, %d forgotten and collected by GC", len(survivors), len(crashed), len(forgotten))
}

// TestRetriedAddAdoptsUntaggedPair recreates by hand what an ADD killed
// between creating the veth pair and tagging its pod end leaves (the pair,
// the host end named for the attachment, no tag) and checks that the
// retried ADD adopts it, while an untagged veth of anyone else's is still
// refused.
func TestRetriedAddAdoptsUntaggedPair(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"adopt","plugins":[{"type":"village","bridge":"adopt0","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.62.0.0/24"}]]}}]}`, data))
	warm := n.NewPod()
	n.MustAdd(l, warm) // makes the bridge
	p := n.NewPod()
	host := netsetup.HostVethName(p.ID, "eth0")
	testenv.MustIP(t, n.NS, "link", "add", host, "master", "adopt0", "up", "type", "veth", "peer", "name", "eth0", "netns", p.NS.Path())
	res := n.MustAdd(l, p)
	if res.Interfaces[1].Name != host {
		t.Fatalf("host interface %s, want the adopted %s", res.Interfaces[1].Name, host)
	}
	must(t, n.Check(l, p), "CHECK of the adopted pair")
	must(t, n.Del(l, p), "DEL")

	// Someone else's untagged veth (its peer is not this attachment's host
	// end) is refused, and nothing is allocated for the failed ADD.
	q := n.NewPod()
	testenv.MustIP(t, n.NS, "link", "add", "stranger0", "type", "veth", "peer", "name", "eth0", "netns", q.NS.Path())
	if _, err := n.Add(l, q); err == nil || !strings.Contains(err.Error(), "was not made for container") {
		t.Fatalf("ADD over a stranger's veth: %v, want a refusal", err)
	}
	if got := ownersOf(t, data); len(got) != 1 {
		t.Fatalf("allocations %v, want only the warm-up pod's", got)
	}
}

// TestCorruptStoreThroughBinaries damages the disk store's data directory
// the ways crashes, full disks and people do (truncated, torn, oversized and
// garbage records, a symlink and a directory named as an address, a garbage
// round-robin marker and index, leftover temporary files) and runs the real
// binaries over it: no panic, every error a CNI error, no damaged address
// handed out again, and GC repairs the damage.
func TestCorruptStoreThroughBinaries(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	dir := filepath.Join(data, "corrupt")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"corrupt","plugins":[{"type":"village","bridge":"corrupt0","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.63.0.0/28"}]]}}]}`, data))
	first := n.NewPod()
	n.MustAdd(l, first) // creates the directory: 10.63.0.2
	outside := filepath.Join(n.Dir, "outside")
	must(t, os.WriteFile(outside, []byte("precious"), 0o600), "write")
	damage := map[string]string{
		"10.63.0.3":           "",                               // truncated to nothing
		"10.63.0.4":           "pod-torn\r\n",                   // torn after the ID
		"10.63.0.5":           "pod-torn\r\neth",                // torn in the ifname... still parses: a real owner
		"10.63.0.6":           strings.Repeat("A", 1<<16),       // oversized
		"10.63.0.7":           "\x00\x00\x00\x00",               // zero-filled block
		"10.63.0.8":           "../../etc\r\neth0",              // traversal as owner
		"10.63.0.9":           "pod-x\r\neth0\r\npod-y\r\neth0", // two owners
		"::ffff:10.63.0.10":   "pod-noncanonical\r\neth0",       // non-canonical (v4-mapped) name
		"last_reserved_ip.0":  "10.63.0.999",
		".village/index.json": `{"version":1,"stamp":"x","records":{"10.63.0.2":{"owner":{}}`,        // the old format
		".village/index":      "village-ipam index 2\nstamp 0:0.0:0.0\n10.63.0.13\to\tghost\teth0\n", // a stale index
		".village/tmp-123":    "pod-ghost\r\neth0",
	}
	for name, content := range damage {
		must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600), "write %s", name)
	}
	must(t, os.Symlink(outside, filepath.Join(dir, "10.63.0.11")), "symlink")
	must(t, os.Mkdir(filepath.Join(dir, "10.63.0.12"), 0o700), "mkdir")
	damaged := []string{"10.63.0.3", "10.63.0.4", "10.63.0.5", "10.63.0.6", "10.63.0.7", "10.63.0.8", "10.63.0.9", "10.63.0.10", "10.63.0.11", "10.63.0.12"}

	// 10.63.0.0/28: .2-.14; .2 is first's, .3-.12 damaged: .13 and .14 are free.
	var pods []*Pod
	got := map[string]bool{}
	for range 2 {
		p := n.NewPod()
		res := n.MustAdd(l, p)
		ip := res.IPs[0].Address.IP.String()
		if slices.Contains(damaged, ip) || got[ip] || ip == "10.63.0.2" {
			t.Fatalf("ADD over a damaged store handed out %s", ip)
		}
		got[ip] = true
		pods = append(pods, p)
	}
	extra := n.NewPod()
	out := n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: extra.ID, Netns: extra.NS.Path(), IfName: "eth0", Stdin: pluginStdin(t, l)})
	if e := CNIError(t, out); e.Code != 100 || !strings.Contains(e.Msg, "10.63.0.") {
		t.Fatalf("ADD into a range full of damaged records: code %d %q, want 100 naming the range", e.Code, e.Msg)
	}
	// DEL of an owner whose record is torn releases only when it matches.
	torn := &Pod{NS: extra.NS, ID: "pod-torn", IfName: "eth"}
	out = n.Exec(testenv.Call{Bin: "village", Command: "DEL", ContainerID: torn.ID, IfName: "eth", Stdin: pluginStdin(t, l)})
	if out.ExitCode != 0 {
		t.Fatalf("DEL of the torn record's owner: %s %s", out.Stdout, out.Stderr)
	}
	// GC with the live pods repairs the rest.
	must(t, n.GC(l, append(pods, first)...), "GC over the damage")
	owners := ownersOf(t, data)
	if len(owners) != 3 {
		t.Fatalf("after GC the store holds %v, want only the 3 live pods", owners)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "precious" {
		t.Fatalf("the symlink's target was touched: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".village", "tmp-123")); err == nil {
		t.Fatal("a leftover temporary file survived a locked operation")
	}
	// Every repaired address is usable again, and no more.
	for range len(damaged) {
		n.MustAdd(l, n.NewPod())
	}
	if _, err := n.Add(l, n.NewPod()); err == nil {
		t.Fatal("ADD succeeded with every address of the range held")
	}
}

// killMidway starts operations (made by launch) and kills each at a random
// moment of its first bound, until want of them were killed mid-way;
// record hears of every attempt, killed or finished first. An operation
// that finished first (one calibration sample is no promise: the
// machine's load moves) shrinks the bound for the next, so the kills find
// the operation whatever its speed now; attempts are capped, and a test
// whose kills never land fails instead of testing nothing.
func killMidway(t *testing.T, section string, want int, bound time.Duration, launch func(i int) (*Pod, *proc, func(*proc) bool), record func(p *Pod, how string, died bool)) {
	t.Helper()
	got := 0
	for i := 0; got < want; i++ {
		if i == 10*want {
			t.Fatalf("%s: only %d of %d were killed mid-way: the kill timing tests nothing", section, got, i)
		}
		p, pr, kill := launch(i)
		time.Sleep(rand.N(bound))
		died := kill(pr)
		record(p, fmt.Sprintf("%s #%d", section, i), died)
		if died {
			got++
		} else {
			bound = max(bound*3/4, time.Millisecond)
		}
	}
}

// TestCrashDuringDel SIGKILLs DEL at random moments (alone, or with the IPAM
// plugin it runs): the runtime's repeated DEL must succeed and leave
// nothing of the pod.
func TestCrashDuringDel(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"crashdel","plugins":[{"type":"village","bridge":"cdel0","isGateway":true,"ipMasq":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.75.0.0/24"}],[{"subnet":"fd75::/64"}]]}}]}`, data))
	stdin := pluginStdin(t, l)
	del := func(p *Pod) *proc {
		return startPlugin(t, n, testenv.Call{Bin: "village", Command: "DEL", ContainerID: p.ID, Netns: p.NS.Path(), IfName: "eth0", Stdin: stdin})
	}
	// How long a DEL takes here.
	first := n.NewPod()
	n.MustAdd(l, first)
	// The checks at the end look where a pod's state is: prove it is there.
	if len(ipFiles(t, data)) == 0 || len(linkNames(testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth"))) == 0 {
		t.Fatalf("no allocation under %s or no veth after an ADD: the checks for leftovers would look at nothing", data)
	}
	t0 := time.Now()
	if err := <-del(first).done; err != nil {
		t.Fatalf("uninterrupted DEL: %v", err)
	}
	whole := time.Since(t0)
	var pods []*Pod
	killed := 0
	killMidway(t, "DEL", 16, whole, func(i int) (*Pod, *proc, func(*proc) bool) {
		p := n.NewPod()
		n.MustAdd(l, p)
		return p, del(p), func(pr *proc) bool { return pr.kill(t, killMode(i%2)) }
	}, func(p *Pod, _ string, died bool) {
		pods = append(pods, p)
		if died {
			killed++
		}
		out := n.Exec(testenv.Call{Bin: "village", Command: "DEL", ContainerID: p.ID, Netns: p.NS.Path(), IfName: "eth0", Stdin: stdin})
		if out.ExitCode != 0 {
			t.Fatalf("DEL repeated after a killed DEL: %s %s", out.Stdout, out.Stderr)
		}
	})
	t.Logf("a DEL takes %s; %d of %d DELs killed mid-way", whole, killed, len(pods))
	if left := ipFiles(t, data); len(left) != 0 {
		t.Fatalf("allocations left: %v", left)
	}
	if veths := linkNames(testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth")); len(veths) != 0 {
		t.Fatalf("veths left: %v", veths)
	}
	for _, p := range pods {
		if out := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(out, "eth0") {
			t.Fatalf("eth0 left in %s", p.ID)
		}
	}
}
