package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netsetup"
)

// tmpfs mounts a tmpfs of the given size (bytes) on a new directory under
// the test's temp dir and unmounts it when the test ends. Plugins exec'd by
// the test share the mount namespace, so they see it.
func tmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	must(t, os.Mkdir(dir, 0o700), "mkdir")
	sh(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "village-test", dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			_ = exec.Command("umount", "-l", dir).Run()
			t.Logf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

func simpleList(t *testing.T, name, bridge, subnet, data string) *libcni.NetworkConfigList {
	return simpleListWith(t, name, bridge, subnet, data, "")
}

// simpleListWith is simpleList with more keys (JSON members ending in a
// comma) in the village entry.
func simpleListWith(t *testing.T, name, bridge, subnet, data, extra string) *libcni.NetworkConfigList {
	return ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":%q,"isGateway":true,"ipMasq":true,%s
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}`, name, bridge, extra, data, subnet))
}

// addFails runs village ADD by hand and returns its CNI error after checking
// that the failed ADD left no interface in the pod and no veth on the node.
func addFails(t *testing.T, n *Node, l *libcni.NetworkConfigList, p *Pod, env ...string) *types.Error {
	t.Helper()
	out := n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: p.ID, Netns: p.NS.Path(), IfName: "eth0", Stdin: pluginStdin(t, l), Env: env})
	e := CNIError(t, out)
	if got := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(got, "eth0") {
		t.Fatalf("failed ADD (%s) left eth0 in the pod: %s", e.Msg, got)
	}
	host := netsetup.HostVethName(p.ID, "eth0")
	if _, err := testenv.IP(n.NS, "link", "show", host); err == nil {
		t.Fatalf("failed ADD (%s) left its host veth %s", e.Msg, host)
	}
	return e
}

// TestReadOnlyDataDir remounts the IPAM data directory read-only: ADD fails
// with an I/O error naming the directory and leaves nothing; DEL of an
// existing pod fails too (the allocation cannot be released) and succeeds
// once the directory is writable again.
func TestReadOnlyDataDir(t *testing.T) {
	n := NewNode(t)
	data := tmpfs(t, 1<<20)
	l := simpleList(t, "rofs", "rofs0", "10.64.0.0/24", data)
	old := n.NewPod()
	n.MustAdd(l, old)
	sh(t, "mount", "-o", "remount,ro", data)
	e := addFails(t, n, l, n.NewPod())
	if e.Code != types.ErrIOFailure || !strings.Contains(e.Msg, filepath.Join(data, "rofs")) || !strings.Contains(e.Msg, "read-only") {
		t.Fatalf("ADD on a read-only data dir: code %d %q, want %d naming the directory and read-only", e.Code, e.Msg, types.ErrIOFailure)
	}
	if err := n.Del(l, old); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("DEL on a read-only data dir: %v, want an error saying so", err)
	}
	if err := n.Status(l); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("STATUS on a read-only data dir: %v, want not ready", err)
	}
	sh(t, "mount", "-o", "remount,rw", data)
	noneLeft(t, data, "DEL once writable again", func() { must(t, n.Del(l, old), "DEL once writable again") })
	n.MustAdd(l, n.NewPod())
}

// TestFullDataDir fills the data directory's filesystem: ADD fails with an
// I/O error saying so and leaves nothing; after space is freed ADD works.
func TestFullDataDir(t *testing.T) {
	n := NewNode(t)
	data := tmpfs(t, 256<<10)
	l := simpleList(t, "full", "full0", "10.65.0.0/24", data)
	n.MustAdd(l, n.NewPod())
	ballast := filepath.Join(data, "ballast")
	// dd stops with "No space left on device": expected.
	_ = exec.Command("dd", "if=/dev/zero", "of="+ballast, "bs=4k").Run()
	e := addFails(t, n, l, n.NewPod())
	if e.Code != types.ErrIOFailure || !strings.Contains(e.Msg, "no space left") {
		t.Fatalf("ADD on a full data dir: code %d %q, want %d saying no space left", e.Code, e.Msg, types.ErrIOFailure)
	}
	if left := ipFiles(t, data); len(left) != 1 {
		t.Fatalf("allocations after the failed ADD: %v, want only the first pod's", left)
	}
	must(t, os.Remove(ballast), "free space")
	n.MustAdd(l, n.NewPod())
}

// TestLockHeldByStuckProcess holds the store's lock from a process that
// never lets go: ADD gives up when its lock timeout fires, with code 11 (try again
// later) naming the lock, and leaves nothing.
func TestLockHeldByStuckProcess(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := simpleList(t, "stuck", "stuck0", "10.66.0.0/24", data)
	n.MustAdd(l, n.NewPod())
	lock := filepath.Join(data, "stuck", "lock")
	stuck := exec.Command("flock", lock, "sleep", "600")
	stuck.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, stuck.Start(), "start the stuck process")
	t.Cleanup(func() { _ = syscall.Kill(-stuck.Process.Pid, syscall.SIGKILL); _ = stuck.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		f, err := os.Open(lock)
		must(t, err, "open lock")
		busy := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
		f.Close()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stuck process never took the lock")
		}
	}
	// The event, not a duration: the 700ms lock timeout fired.
	e := addFails(t, n, l, n.NewPod(), "VILLAGE_IPAM_LOCK_TIMEOUT=700ms")
	if e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, lock) || !strings.Contains(e.Msg, "gave up after 700ms") {
		t.Fatalf("ADD with the lock held: code %d %q, want %d saying it gave up after 700ms naming %s", e.Code, e.Msg, types.ErrTryAgainLater, lock)
	}
	_ = syscall.Kill(-stuck.Process.Pid, syscall.SIGKILL)
	_ = stuck.Wait()
	n.MustAdd(l, n.NewPod())
}

// TestBridgeDeletedByHand deletes the bridge under a running pod: CHECK of
// the pod names the bridge, the next ADD recreates it (with its gateway and
// masquerade), and the old pod's DEL still works.
func TestBridgeDeletedByHand(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := simpleList(t, "brdel", "brdel0", "10.67.0.0/24", data)
	old := n.NewPod()
	n.MustAdd(l, old)
	must(t, n.Check(l, old), "CHECK before")
	testenv.MustIP(t, n.NS, "link", "del", "brdel0")
	if err := n.Check(l, old); err == nil || !strings.Contains(err.Error(), `bridge "brdel0"`) {
		t.Fatalf("CHECK with the bridge gone: %v, want an error naming the bridge", err)
	}
	// The masquerade rules remain but the bridge (and its stamp) went:
	// flush them too, so the next ADD has to put everything back.
	inNS(t, n.NS, "iptables", "-w", "-t", "nat", "-F", "POSTROUTING")
	p := n.NewPod()
	res := n.MustAdd(l, p)
	out := testenv.MustIP(t, n.NS, "-o", "addr", "show", "dev", "brdel0")
	if !strings.Contains(out, "10.67.0.1/24") {
		t.Fatalf("recreated bridge has no gateway: %s", out)
	}
	must(t, n.Check(l, p), "CHECK of a pod on the recreated bridge")
	must(t, testenv.Ping(p.NS, "10.67.0.1", 1), "ping the gateway")
	if res.IPs[0].Address.IP.String() == "" {
		t.Fatal("no address")
	}
	noneLeft(t, data, "DEL of both pods", func() {
		must(t, n.Del(l, old), "DEL of the pod whose bridge was deleted")
		must(t, n.Del(l, p), "DEL")
	})
}

// TestMasqueradeChainFlushedByHand empties, then deletes, the network's
// masquerade chain of the iptables backend: CHECK names the chain each time,
// and only the next ADD restores it.
func TestMasqueradeChainFlushedByHand(t *testing.T) {
	n := NewNode(t)
	l := simpleListWith(t, "mflush", "mflush0", "10.68.0.0/24", filepath.Join(n.Dir, "ipam"), `"ipMasqBackend":"iptables",`)
	p := n.NewPod()
	n.MustAdd(l, p)
	must(t, n.Check(l, p), "CHECK before")
	chain := masq.Chain("mflush")
	inNS(t, n.NS, "iptables", "-w", "-t", "nat", "-F", chain)
	if err := n.Check(l, p); err == nil || !strings.Contains(err.Error(), chain) {
		t.Fatalf("CHECK with %s flushed: %v, want an error naming the chain", chain, err)
	}
	// CHECK repairs nothing; the next ADD puts the rules back (CHECK passes
	// again), then the chain is deleted.
	p2 := n.NewPod()
	n.MustAdd(l, p2)
	must(t, n.Check(l, p), "CHECK after the next ADD repaired the rules")
	inNS(t, n.NS, "iptables", "-w", "-t", "nat", "-F", "POSTROUTING")
	inNS(t, n.NS, "iptables", "-w", "-t", "nat", "-F", chain)
	inNS(t, n.NS, "iptables", "-w", "-t", "nat", "-X", chain)
	if err := n.Check(l, p); err == nil || !strings.Contains(err.Error(), chain) {
		t.Fatalf("CHECK with %s deleted: %v, want an error naming the chain", chain, err)
	}
	must(t, n.Del(l, p), "DEL with the rules gone")
	must(t, n.Del(l, p2), "DEL of the second pod")
}

// TestIPAMMissingFromCNIPath runs village with a CNI_PATH that holds village
// but not village-ipam: ADD and DEL fail with an error naming the plugin
// and the path searched, and ADD leaves nothing.
func TestIPAMMissingFromCNIPath(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := simpleList(t, "noipam", "noipam0", "10.69.0.0/24", data)
	b, err := os.ReadFile(filepath.Join(testenv.Bins(t), "village"))
	must(t, err, "read village")
	only := execDir(t, filepath.Join(n.Dir, "only-village"), map[string][]byte{"village": b})
	p := n.NewPod()
	for _, cmd := range []string{"ADD", "DEL"} {
		out := n.Exec(testenv.Call{Bin: filepath.Join(only, "village"), Command: cmd, ContainerID: p.ID, Netns: p.NS.Path(), IfName: "eth0",
			Path: only, Stdin: pluginStdin(t, l)})
		e := CNIError(t, out)
		if e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, `"village-ipam"`) || !strings.Contains(e.Msg, only) {
			t.Fatalf("%s without the IPAM plugin: code %d %q, want %d naming village-ipam and %s", cmd, e.Code, e.Msg, types.ErrInvalidNetworkConfig, only)
		}
	}
	if got := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(got, "eth0") {
		t.Fatalf("ADD without IPAM left eth0: %s", got)
	}
	// No IPAM plugin ran: it did not even make its data directory.
	if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("IPAM data directory %s after ADD without IPAM: %v, want none", data, err)
	}
}

// TestIPAMFailingAfterItsAnswer: village reads the IPAM plugin's result as
// soon as the plugin closes its stdout and configures the pod while the
// plugin exits. A plugin that then exits non-zero has not succeeded: the
// ADD fails with its error, and everything made with those addresses is
// undone, the addresses released through the plugin's DEL.
func TestIPAMFailingAfterItsAnswer(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := simpleList(t, "lateipam", "late0", "10.68.0.0/24", data)
	verbs := filepath.Join(n.Dir, "verbs")
	script := fmt.Sprintf(`#!/bin/sh
echo "$CNI_COMMAND" >> %s
[ "$CNI_COMMAND" = ADD ] || exec %s
out=$(%[2]s) || exit 9
printf '%%s' "$out"
exec 1>&-
sleep 0.2
echo "late failure" >&2
exit 1
`, verbs, filepath.Join(testenv.Bins(t), "village-ipam"))
	wrap := execDir(t, filepath.Join(n.Dir, "late-bin"), map[string][]byte{"village-ipam": []byte(script)})
	p := n.NewPod()
	e := addFails(t, n, l, p, "CNI_PATH="+wrap+":"+testenv.CNIPath(t))
	if !strings.Contains(e.Msg, "late failure") || !strings.Contains(e.Msg, `"village-ipam"`) {
		t.Fatalf("ADD: %+v, want the IPAM plugin's late failure", e)
	}
	if got, err := os.ReadFile(verbs); err != nil || string(got) != "ADD\nDEL\n" {
		t.Fatalf("IPAM verbs %q (%v), want the ADD and the DEL that undoes it", got, err)
	}
	mustExist(t, filepath.Join(data, "lateipam")) // the IPAM ADD ran here
	if left := ipFiles(t, data); len(left) != 0 {
		t.Fatalf("allocations after the failed ADD: %v", left)
	}
}
