package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/internal/testenv"
)

var oldLibcni struct {
	once sync.Once
	bin  string
	err  error
}

// libcni11 builds test/libcni-v1.1 (its own module, pinned to libcni 1.1.2)
// once per test process and returns the binary.
func libcni11(t *testing.T) string {
	t.Helper()
	oldLibcni.once.Do(func() {
		root, err := testenv.ModuleRoot()
		if err != nil {
			oldLibcni.err = err
			return
		}
		dir, err := os.MkdirTemp("", "village-libcni11-")
		if err != nil {
			oldLibcni.err = err
			return
		}
		oldLibcni.bin = filepath.Join(dir, "libcni-v1.1")
		cmd := exec.Command("go", "build", "-trimpath", "-o", oldLibcni.bin, ".")
		cmd.Dir = filepath.Join(root, "test", "libcni-v1.1")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			oldLibcni.err = &outputError{err: err, out: string(out)}
		}
	})
	if oldLibcni.err != nil {
		t.Fatalf("building test/libcni-v1.1: %v", oldLibcni.err)
	}
	return oldLibcni.bin
}

// outputError is a command's error with what it printed.
type outputError struct {
	err error
	out string
}

func (e *outputError) Error() string { return e.err.Error() + "\n" + e.out }

// oldRuntime is a runtime with libcni 1.1.2 on node n: the helper binary
// run inside the node with its own libcni cache directory.
type oldRuntime struct {
	n     *Node
	conf  string // file
	cache string
}

func (o *oldRuntime) run(t *testing.T, verb string, p *Pod) (string, error) {
	t.Helper()
	args := []string{"-conf", o.conf, "-path", testenv.CNIPath(t), "-cache", o.cache, "-verb", verb}
	if p != nil {
		args = append(args, "-id", p.ID, "-netns", p.NS.Path(), "-ifname", p.IfName)
	}
	var out []byte
	err := o.n.in(func() error {
		var err error
		out, err = exec.Command(libcni11(t), args...).CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), &outputError{err: err, out: string(out)}
	}
	return string(out), nil
}

// shippedExample is one file of conf/ that runs on a single namespace node,
// made ready for it (data dir, an underlay eth0 with the address the static
// examples name for node 1).
type shippedExample struct {
	file    string
	village bool // a village network (else the loopback .conf)
}

var singleNodeExamples = []shippedExample{
	{"10-village.conflist", true},
	{"30-village-vxlan-static.conflist", true},
	{"31-village-hostgw-static.conflist", true},
	{"32-village-auto-static.conflist", true},
	{"99-loopback.conf", false},
}

// prepare makes the node for the example and returns the list (current
// libcni's reading) and the file an old runtime loads.
func (e shippedExample) prepare(t *testing.T, n *Node) (*libcni.NetworkConfigList, string) {
	t.Helper()
	src := filepath.Join(confDir(t), e.file)
	var l *libcni.NetworkConfigList
	if e.village {
		// A node on a LAN, its default route there (villaged finds the
		// underlay through it); the static examples name 192.168.50.11.
		NewLAN(t).Attach(t, n.NS, "eth0", "192.168.50.11/24")
		testenv.MustIP(t, n.NS, "route", "add", "default", "via", "192.168.50.1")
		l = withDataDir(t, src, filepath.Join(n.Dir, "ipam"), "10.244.1.0/24")
		path := filepath.Join(n.Dir, e.file)
		must(t, os.WriteFile(path, l.Bytes, 0o600), "write %s", path)
		return l, path
	}
	c, err := libcni.ConfFromFile(src)
	must(t, err, "load %s", src)
	l, err = libcni.ConfListFromConf(c)
	must(t, err, "list from %s", src)
	return l, src
}

// podsWork checks what the example gave the pods: for a village network,
// every address reachable from the other pod and from the node; for
// loopback, lo up (the test brought it down before ADD).
func (e shippedExample) podsWork(t *testing.T, n *Node, pods []*Pod, results []*current.Result) {
	t.Helper()
	if !e.village {
		for _, p := range pods {
			if out := testenv.MustIP(t, p.NS, "-o", "link", "show", "lo"); !strings.Contains(out, ",UP") {
				t.Fatalf("lo not up after ADD: %s", out)
			}
		}
		return
	}
	for i, r := range results {
		if len(r.IPs) == 0 {
			t.Fatalf("pod %d: no address in the result", i)
		}
		for _, ipc := range r.IPs {
			ip := ipc.Address.IP.String()
			must(t, testenv.Ping(pods[1-i].NS, ip, 2), "pod -> pod %s", ip)
			must(t, testenv.Ping(n.NS, ip, 2), "node -> pod %s", ip)
		}
	}
}

func (e shippedExample) newPods(t *testing.T, n *Node) []*Pod {
	pods := []*Pod{n.NewPod(), n.NewPod()}
	if !e.village {
		for _, p := range pods {
			testenv.MustIP(t, p.NS, "link", "set", "lo", "down")
		}
	}
	return pods
}

// held says what a node holds before the teardown nothingLeft checks:
// allocations and host veths (a Village network), libcni cache entries
// (the runtime cached a result).
type held struct{ attachments, cached bool }

// nothingLeft proves do (the DELs) leaves no allocation, no host veth and
// no libcni cache entry on the node: what h says the node holds must be
// there before, so a wrong path or a test that made nothing fails.
func nothingLeft(t *testing.T, n *Node, cache string, h held, do func()) {
	t.Helper()
	allocs := func() []string { return ipFiles(t, filepath.Join(n.Dir, "ipam")) }
	veths := func() []string {
		var out []string
		for _, l := range strings.Split(testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth"), "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "veth") {
				out = append(out, l)
			}
		}
		return out
	}
	entries := func() []string { return files(t, filepath.Join(cache, "results")) }
	if h.attachments && (len(allocs()) == 0 || len(veths()) == 0) {
		t.Fatalf("before the DELs: allocations %v, host veths %v; want both, or there is nothing to prove gone", allocs(), veths())
	}
	if h.cached && len(entries()) == 0 {
		t.Fatalf("before the DELs: no libcni cache entry under %s, so nothing to prove gone (wrong path?)", cache)
	}
	do()
	if left := allocs(); len(left) != 0 {
		t.Fatalf("allocations left: %v", left)
	}
	if left := veths(); len(left) != 0 {
		t.Fatalf("host veths left on the node: %v", left)
	}
	if left := entries(); len(left) != 0 {
		t.Fatalf("libcni cache entries left: %v", left)
	}
}

// TestShippedConfsUnderLibcni11 runs every example that fits on one node
// through libcni 1.1.2 (containerd 1.6/1.7, podman 4, CRI-O of that age):
// it reads cniVersion 1.0.0 (it does not know cniVersions), ADD results
// decode, pods reach each other and the node, CHECK passes, DEL (twice)
// leaves nothing.
func TestShippedConfsUnderLibcni11(t *testing.T) {
	// The control: the helper really is the old libcni, which fails on a
	// list that says 1.1.0 (what every shipped file said before).
	t.Run("control: cniVersion 1.1.0 alone", func(t *testing.T) {
		n := NewNode(t)
		l, _ := singleNodeExamples[0].prepare(t, n)
		b := strings.Replace(string(l.Bytes), `"cniVersion": "1.0.0"`, `"cniVersion": "1.1.0"`, 1)
		b = strings.Replace(b, `"cniVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"],`, "", 1)
		file := filepath.Join(n.Dir, "only-1.1.0.conflist")
		must(t, os.WriteFile(file, []byte(b), 0o600), "write")
		o := &oldRuntime{n: n, conf: file, cache: filepath.Join(n.Dir, "cache-1.1")}
		p := n.NewPod()
		if out, err := o.run(t, "add", p); err == nil || !strings.Contains(out, `unsupported CNI result version "1.1.0"`) {
			t.Fatalf("libcni 1.1.2 ADD with cniVersion 1.1.0: %v\n%s\nwant the failure containerd 1.6 shows", err, out)
		}
		// The plugin's ADD succeeded (libcni refused its result), so the
		// pod's allocation and veth are there for the DEL to remove.
		nothingLeft(t, n, o.cache, held{attachments: true}, func() {
			_, err := o.run(t, "del", p)
			must(t, err, "DEL")
		})
	})
	for _, e := range singleNodeExamples {
		t.Run(e.file, func(t *testing.T) {
			n := NewNode(t)
			_, file := e.prepare(t, n)
			o := &oldRuntime{n: n, conf: file, cache: filepath.Join(n.Dir, "cache-1.1")}
			if v, err := o.run(t, "version", nil); err != nil || strings.TrimSpace(v) != "1.0.0" {
				t.Fatalf("libcni 1.1.2 reads cniVersion %q (%v), want 1.0.0", v, err)
			}
			pods := e.newPods(t, n)
			var results []*current.Result
			for _, p := range pods {
				out, err := o.run(t, "add", p)
				must(t, err, "ADD through libcni 1.1.2")
				r := &current.Result{}
				must(t, json.Unmarshal([]byte(out), r), "decode libcni 1.1.2's result %s", out)
				if r.CNIVersion != "1.0.0" {
					t.Fatalf("result version %q, want 1.0.0: %s", r.CNIVersion, out)
				}
				results = append(results, r)
			}
			e.podsWork(t, n, pods, results)
			for _, p := range pods {
				_, err := o.run(t, "check", p)
				must(t, err, "CHECK through libcni 1.1.2")
			}
			nothingLeft(t, n, o.cache, held{attachments: e.village, cached: true}, func() {
				for _, p := range pods {
					for range 2 {
						_, err := o.run(t, "del", p)
						must(t, err, "DEL through libcni 1.1.2")
					}
				}
			})
		})
	}
}

// TestShippedConfsUnderCurrentLibcni runs the same examples through the
// libcni the project builds with (v1.3.1): it picks 1.1.0 from cniVersions,
// results are 1.1.0, STATUS passes and GC releases exactly the pods the
// runtime no longer lists. The single .conf (loopback) cannot list
// versions and stays at 1.0.0. villaged status reads the example too.
func TestShippedConfsUnderCurrentLibcni(t *testing.T) {
	for _, e := range singleNodeExamples {
		t.Run(e.file, func(t *testing.T) {
			n := NewNode(t)
			l, file := e.prepare(t, n)
			want := "1.1.0"
			if !e.village {
				want = "1.0.0"
			}
			if l.CNIVersion != want {
				t.Fatalf("libcni reads version %q, want %s", l.CNIVersion, want)
			}
			pods := e.newPods(t, n)
			var results []*current.Result
			for _, p := range pods {
				res, err := n.Add(l, p)
				must(t, err, "ADD")
				if res.Version() != want {
					t.Fatalf("result version %q, want %s", res.Version(), want)
				}
				r, err := current.NewResultFromResult(res)
				must(t, err, "result")
				results = append(results, r)
			}
			e.podsWork(t, n, pods, results)
			for _, p := range pods {
				must(t, n.Check(l, p), "CHECK")
			}
			must(t, n.Status(l), "STATUS")
			if e.village {
				out, err := exec.Command("ip", "netns", "exec", n.Name(), filepath.Join(testenv.Bins(t), "villaged"),
					"status", "--conf", file, "--node-name", "node1").CombinedOutput()
				if err != nil {
					t.Fatalf("villaged status --conf %s: %v\n%s", file, err, out)
				}
				// GC keeping only pod 0 releases pod 1's addresses.
				before := len(ipFiles(t, filepath.Join(n.Dir, "ipam")))
				must(t, n.GC(l, pods[0]), "GC")
				if after := len(ipFiles(t, filepath.Join(n.Dir, "ipam"))); before < 2 || after != before/2 {
					t.Fatalf("GC keeping one of two pods: %d allocations before, %d after", before, after)
				}
			}
			nothingLeft(t, n, filepath.Join(n.Dir, "cache"), held{attachments: e.village, cached: true}, func() {
				for _, p := range pods {
					must(t, n.Del(l, p), "DEL")
				}
			})
		})
	}
}
