package agentsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// book is a Handler over a fixed table: what the protocol carries, not
// what the agent decides (pkg/agent and test/kube test that).
type book struct {
	mu      sync.Mutex
	reports []Report
}

func (b *book) LANPod(_ context.Context, network string, p Pod) (LAN, error) {
	switch p.Name {
	case "db-0":
		return LAN{Want: true, IPs: []string{"192.168.50.210"}}, nil
	case "new":
		return LAN{}, fmt.Errorf("pod %s not seen yet: %w", p, ErrRetry)
	case "no":
		return LAN{}, errors.New("namespace may not ask")
	}
	return LAN{}, nil
}

func (b *book) LANReport(_ context.Context, _ string, _ Pod, r Report) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reports = append(b.reports, r)
	return nil
}

func (b *book) LANList(context.Context) ([]LANPod, error) {
	return []LANPod{{Namespace: "ns", Name: "db-0", Addresses: "net1=192.168.50.210/24"}}, nil
}

func serve(t *testing.T, h Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", SocketName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Serve(ctx, l, h, t.Logf) }()
	t.Cleanup(func() { cancel(); <-done })
	return path
}

func TestRoundTrip(t *testing.T) {
	b := &book{}
	path := serve(t, b)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: %v %v, want a 0600 socket", path, fi.Mode(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ask := func(op, name string, r *Report) (*Response, error) {
		return Ask(ctx, path, Request{Op: op, Network: "village", Pod: &Pod{Namespace: "ns", Name: name}, Report: r})
	}
	resp, err := ask(OpLANPod, "db-0", nil)
	if err != nil || resp.LAN == nil || !resp.LAN.Want || len(resp.LAN.IPs) != 1 || resp.LAN.IPs[0] != "192.168.50.210" {
		t.Fatalf("lan-pod db-0: %+v %v", resp, err)
	}
	resp, err = ask(OpLANPod, "web", nil)
	if err != nil || resp.LAN == nil || resp.LAN.Want {
		t.Fatalf("lan-pod web: %+v %v, want no LAN", resp, err)
	}
	var e *Error
	if _, err = ask(OpLANPod, "new", nil); !errors.As(err, &e) || !e.Retry || !strings.Contains(err.Error(), "not seen yet") {
		t.Fatalf("lan-pod new: %v, want a retryable refusal", err)
	}
	if _, err = ask(OpLANPod, "no", nil); !errors.As(err, &e) || e.Retry || !strings.Contains(err.Error(), "may not") {
		t.Fatalf("lan-pod no: %v, want a final refusal", err)
	}
	if _, err = ask(OpLANReport, "db-0", &Report{IfName: "net1", Addresses: []string{"192.168.50.210/24"}}); err != nil {
		t.Fatal(err)
	}
	if _, err = ask(OpLANReport, "db-0", nil); err == nil {
		t.Fatal("a report without a report was accepted")
	}
	if len(b.reports) != 1 || b.reports[0].Addresses[0] != "192.168.50.210/24" {
		t.Fatalf("reports %+v", b.reports)
	}
	resp, err = Ask(ctx, path, Request{Op: OpLANList})
	if err != nil || len(resp.Pods) != 1 || resp.Pods[0].Name != "db-0" {
		t.Fatalf("lan-list: %+v %v", resp, err)
	}
	if _, err = Ask(ctx, path, Request{Op: "nonsense"}); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Fatalf("unknown op: %v", err)
	}
}

func TestNoAgentNamesTheSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	_, err := Ask(context.Background(), path, Request{Op: OpLANList})
	var e *Error
	if !errors.As(err, &e) || !e.Retry || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "villaged") {
		t.Fatalf("no agent: %v, want a retryable error naming %s and villaged", err, path)
	}
}

// TestStaleSocketReplaced: an agent restarting after a crash finds its
// old socket file and replaces it.
func TestStaleSocketReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the stale socket is not there: %v", err)
	}
	l2, err := Listen(path)
	if err != nil {
		t.Fatalf("listening over a stale socket: %v", err)
	}
	l2.Close()
}

// FuzzHandle: whatever a client writes, the server answers one JSON line
// and never panics; a refusal has a sentence.
func FuzzHandle(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"op":"lan-pod","pod":{"namespace":"ns","name":"db-0"}}`,
		`{"v":1,"op":"lan-report","pod":{"namespace":"ns","name":"db-0"}}`,
		`{"v":2,"op":"lan-list"}`, `{"op":"lan-pod"}`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var req Request
		var resp Response
		if err := json.Unmarshal(line, &req); err != nil {
			return
		}
		resp = handle(context.Background(), &book{}, req)
		if !resp.OK && resp.Error == "" {
			t.Fatalf("%q: refusal without a sentence", line)
		}
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
	})
}

var _ net.Conn = (*net.UnixConn)(nil)
