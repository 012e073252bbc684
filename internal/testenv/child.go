package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// A child is the test binary run again inside a test node's namespace with
// `ip netns exec`, so that every thread of it is in that namespace: what a
// switch of one locked thread cannot give code that opens sockets from its
// own goroutines (wireguard-go). The test's TestMain hands control to
// ServeChild when IsChild; the parent sends one JSON command a line on the
// child's stdin and reads one JSON answer a line from its stdout (after
// childPrefix: other output is ignored). The child stops when its stdin
// closes, which the parent does when the test ends, pass or fail, before
// the namespace is removed.

const (
	childEnv    = "VILLAGE_TEST_CHILD"
	childPrefix = "VILLAGE-CHILD "
)

// IsChild reports whether this process is a child StartChild started.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// ServeChild answers the parent's commands with handle until stdin closes
// or handle says stop (after its answer is written).
func ServeChild(handle func(cmd []byte) (answer any, stop bool)) {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for sc.Scan() {
		answer, stop := handle(sc.Bytes())
		b, err := json.Marshal(answer)
		if err != nil {
			b, _ = json.Marshal(fmt.Sprintf("unencodable answer: %v", err))
		}
		fmt.Printf("%s%s\n", childPrefix, b)
		if stop {
			return
		}
	}
}

// Child is the parent's handle on a child process.
type Child struct {
	t      testing.TB
	n      ns.NetNS
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncBuf
}

// StartChild runs the test binary as a child in n (no test of its own runs:
// TestMain serves). It is stopped when the test ends: stdin closed, then
// killed if it has not exited within ten seconds. Its stderr is logged
// when the test failed.
func StartChild(t testing.TB, n ns.NetNS) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{t: t, n: n, stdin: stdin, lines: make(chan string), stderr: &syncBuf{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 16<<20)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), childPrefix); ok {
				c.lines <- s
			}
		}
	}()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second): // hung: the test fails
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("child in %s did not exit when its input closed; killed", n.Path())
		}
		if t.Failed() {
			t.Logf("child in %s, stderr:\n%s", n.Path(), c.stderr.String())
		}
	})
	return c
}

// Do sends cmd and decodes the child's answer into answer; a child that
// exits or answers something undecodable fails the test.
func (c *Child) Do(cmd, answer any) {
	c.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c.stdin, "%s\n", b); err != nil {
		c.t.Fatalf("child in %s: %v", c.n.Path(), err)
	}
	line, ok := <-c.lines
	if !ok {
		c.t.Fatalf("child in %s exited; stderr:\n%s", c.n.Path(), c.stderr.String())
	}
	if err := json.Unmarshal([]byte(line), answer); err != nil {
		c.t.Fatalf("child in %s answered %q: %v", c.n.Path(), line, err)
	}
}

// Stderr is what the child wrote to its stderr so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// syncBuf is a buffer written by exec's copier while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// PrivateWireGuardRun gives a child its own empty /var/run/wireguard (a
// tmpfs in the mount namespace `ip netns exec` made for it), so that test
// nodes on one machine can each run a userspace WireGuard device of the
// same name: its UAPI socket lives there. Call it in the child, first.
func PrivateWireGuardRun() error {
	const dir = "/var/run/wireguard"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755")
}
