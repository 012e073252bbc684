package agentsock

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// peerEnv makes the test binary a client of the socket it names.
const peerEnv = "AGENTSOCK_TEST_PEER"

// TestMain runs the non-root client of TestNonRootPeerRefused when the
// test binary is started as one: it sends a DHCP request and prints the
// answer (nothing when the agent closed without one).
func TestMain(m *testing.M) {
	if path := os.Getenv(peerEnv); path != "" {
		resp, err := Ask(context.Background(), path, Request{Op: OpDHCP, DHCP: &DHCPRequest{Op: DHCPAcquire}})
		if resp != nil && resp.OK {
			os.Stdout.WriteString("ANSWERED\n")
		}
		os.Stdout.WriteString("uid " + strconv.Itoa(os.Getuid()) + ": ")
		if err != nil {
			os.Stdout.WriteString(err.Error())
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// counting is a book that counts the DHCP requests it is handed.
type counting struct {
	book
	mu    sync.Mutex
	calls int
}

func (c *counting) DHCP(ctx context.Context, req DHCPRequest) (DHCPResponse, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.book.DHCP(ctx, req)
}

// TestNonRootPeerRefused: a process of another user that reaches the
// socket (its file and directory opened to everyone here, as a mistaken
// chmod would) is refused by the SO_PEERCRED check: no answer, and the
// handler never runs.
func TestNonRootPeerRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("this test needs root: it runs a client as another user")
	}
	dir, err := os.MkdirTemp("", "agentsock-peer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The test binary, where user nobody can run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	copyFile(t, self, bin)
	path := filepath.Join(dir, "run", SocketName)
	h := &counting{}
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	var logs []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Serve(ctx, l, h, func(f string, a ...any) {
			logMu.Lock()
			defer logMu.Unlock()
			logs = append(logs, f)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	for _, p := range []string{dir, filepath.Dir(path)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	cmd := exec.CommandContext(cctx, bin)
	cmd.Env = append(os.Environ(), peerEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v: %s", err, out)
	}
	if !strings.HasPrefix(string(out), "uid 65534: ") || strings.Contains(string(out), "ANSWERED") || !strings.Contains(string(out), "no answer") {
		t.Fatalf("client as uid 65534: %q, want no answer", out)
	}
	h.mu.Lock()
	calls := h.calls
	h.mu.Unlock()
	if calls != 0 {
		t.Fatalf("the handler ran %d times for a non-root peer", calls)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if len(logs) != 1 || !strings.Contains(logs[0], "only root") {
		t.Fatalf("logs %q, want one refusal", logs)
	}
	// Root on the same socket is answered.
	if _, err := Ask(cctx, path, Request{Op: OpDHCP, DHCP: &DHCPRequest{Op: DHCPAcquire}}); err != nil {
		t.Fatalf("root: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
