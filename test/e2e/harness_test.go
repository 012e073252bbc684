// Package e2e runs the built Village binaries the way a container runtime
// does: through libcni (the library behind cnitool) or cnitool itself, from
// inside a "node" network namespace the test makes, against "pod"
// namespaces the test makes. Nothing here touches the machine's own network
// namespace.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
)

// Node is a test node: a network namespace where plugins run, a libcni
// runtime with its own cache directory, and a directory for IPAM data.
type Node struct {
	t   testing.TB
	NS  ns.NetNS
	CNI *libcni.CNIConfig
	Dir string
}

func NewNode(t testing.TB) *Node {
	t.Helper()
	n := &Node{t: t, NS: testenv.NewNS(t), Dir: t.TempDir()}
	n.CNI = libcni.NewCNIConfigWithCacheDir(filepath.SplitList(testenv.CNIPath(t)), filepath.Join(n.Dir, "cache"), nil)
	return n
}

// Name is the node namespace's name under /run/netns.
func (n *Node) Name() string { return filepath.Base(n.NS.Path()) }

// Pod is a pod sandbox: its namespace and the container ID the runtime uses.
type Pod struct {
	NS     ns.NetNS
	ID     string
	IfName string
}

func (n *Node) NewPod() *Pod {
	return &Pod{NS: testenv.NewNS(n.t), ID: "pod-" + randHex(6), IfName: "eth0"}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (p *Pod) rt() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.ID, NetNS: p.NS.Path(), IfName: p.IfName}
}

// ConfList parses a conflist, failing the test on error.
func ConfList(t testing.TB, s string) *libcni.NetworkConfigList {
	t.Helper()
	l, err := libcni.ConfListFromBytes([]byte(s))
	if err != nil {
		t.Fatalf("bad conflist in test: %v\n%s", err, s)
	}
	return l
}

func (n *Node) in(f func() error) error { return testenv.InNS(n.NS, f) }

func (n *Node) Add(l *libcni.NetworkConfigList, p *Pod) (types.Result, error) {
	var res types.Result
	err := n.in(func() error {
		var err error
		res, err = n.CNI.AddNetworkList(context.Background(), l, p.rt())
		return err
	})
	return res, err
}

// MustAdd adds p and returns the result as the current version.
func (n *Node) MustAdd(l *libcni.NetworkConfigList, p *Pod) *current.Result {
	n.t.Helper()
	res, err := n.Add(l, p)
	if err != nil {
		n.t.Fatalf("ADD %s: %v", p.ID, err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		n.t.Fatalf("ADD %s: result: %v", p.ID, err)
	}
	return cur
}

func (n *Node) Del(l *libcni.NetworkConfigList, p *Pod) error {
	return n.in(func() error { return n.CNI.DelNetworkList(context.Background(), l, p.rt()) })
}

func (n *Node) Check(l *libcni.NetworkConfigList, p *Pod) error {
	return n.in(func() error { return n.CNI.CheckNetworkList(context.Background(), l, p.rt()) })
}

func (n *Node) GC(l *libcni.NetworkConfigList, valid ...*Pod) error {
	args := &libcni.GCArgs{}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.ID, IfName: p.IfName})
	}
	return n.in(func() error { return n.CNI.GCNetworkList(context.Background(), l, args) })
}

func (n *Node) Status(l *libcni.NetworkConfigList) error {
	return n.in(func() error { return n.CNI.GetStatusNetworkList(context.Background(), l) })
}

// Exec runs one plugin binary by hand inside the node, the way a runtime
// would, for tests of raw input and output.
func (n *Node) Exec(c testenv.Call) testenv.Output {
	n.t.Helper()
	if c.Path == "" {
		c.Path = testenv.CNIPath(n.t)
	}
	if !strings.Contains(c.Bin, "/") {
		c.Bin = filepath.Join(testenv.Bins(n.t), c.Bin)
	}
	c.In = n.NS
	return testenv.Exec(n.t, c)
}

// CNIError decodes the error JSON a failed plugin printed on stdout.
func CNIError(t testing.TB, out testenv.Output) *types.Error {
	t.Helper()
	if out.ExitCode == 0 {
		t.Fatalf("plugin succeeded, want an error; stdout: %s", out.Stdout)
	}
	e := &types.Error{}
	if err := json.Unmarshal(out.Stdout, e); err != nil {
		t.Fatalf("stdout is not a CNI error JSON (%v): %q; stderr: %s", err, out.Stdout, out.Stderr)
	}
	if strings.Contains(string(out.Stderr), "panic") || strings.Contains(string(out.Stderr), "goroutine ") {
		t.Fatalf("plugin panicked: %s", out.Stderr)
	}
	return e
}

// sh runs a command and returns its combined output, failing on error.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNS runs a command inside a namespace and returns its output.
func inNS(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	return sh(t, "ip", append([]string{"netns", "exec", filepath.Base(n.Path())}, args...)...)
}

// podAddrs returns `ip -o addr show dev ifname` inside the pod.
func podAddrs(t *testing.T, p *Pod, ifname string) string {
	t.Helper()
	return testenv.MustIP(t, p.NS, "-o", "addr", "show", "dev", ifname)
}

// files lists the regular files under dir (relative paths).
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// noneLeft proves that do (a DEL, a GC) leaves no allocation file under
// dir: there must be at least one before it (so a wrong path, or a test that
// never allocated, fails instead of passing on an empty directory), and
// none after.
func noneLeft(t *testing.T, dir, what string, do func()) {
	t.Helper()
	before := ipFiles(t, dir)
	if len(before) == 0 {
		t.Fatalf("%s: no allocation under %s before it, so nothing to prove gone (wrong path?)", what, dir)
	}
	do()
	if left := ipFiles(t, dir); len(left) != 0 {
		t.Fatalf("%s left allocations %v (of %v)", what, left, before)
	}
}

// mustExist fails the test when dir is not a directory: a check that
// nothing is left under a wrong path would pass for nothing.
func mustExist(t *testing.T, dir string) {
	t.Helper()
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s is not a directory (%v): wrong path?", dir, err)
	}
}

// ipFiles lists the allocation files (named by an IP) in an IPAM data dir
// (none when dir does not exist: "nothing left" assertions use noneLeft).
func ipFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, f := range files(t, dir) {
		base := filepath.Base(f)
		if strings.Count(base, ".") == 3 || strings.Contains(base, ":") {
			if !strings.HasPrefix(base, "last_reserved_ip") {
				out = append(out, f)
			}
		}
	}
	return out
}

// execDir makes dir and writes each of files (name to content) into it as
// an executable: wrappers and spies put in front of CNI_PATH or PATH.
// It returns dir.
func execDir(t testing.TB, dir string, files map[string][]byte) string {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755), "mkdir %s", dir)
	for name, content := range files {
		must(t, os.WriteFile(filepath.Join(dir, name), content, 0o755), "write %s", name)
	}
	return dir
}

func must(t testing.TB, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
