package agentsock

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
)

// An agent that starts while the client waits is asked and answers; no
// agent within the bound is a CodeNoAgent error naming the socket, the
// wait and its bound; a refusal is returned at once, not waited out.
func TestAskWaiting(t *testing.T) {
	ctx := context.Background()
	t.Run("AgentStartsDuringTheWait", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "run", SocketName)
		got := make(chan error, 1)
		var resp *Response
		go func() {
			var err error
			resp, err = AskWaiting(ctx, path, Request{Op: OpLANPod, Network: "n", Pod: &Pod{Namespace: "ns", Name: "db-0"}}, time.Minute)
			got <- err
		}()
		// The agent comes up once the client has found no socket.
		if err := pollCond(func() bool { _, err := net.Dial("unix", path); return err != nil }); err != nil {
			t.Fatal(err)
		}
		l, err := Listen(path)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); Serve(sctx, l, &book{}, t.Logf) }()
		defer func() { cancel(); <-done }()
		if err := <-got; err != nil || resp.LAN == nil || !resp.LAN.Want {
			t.Fatalf("AskWaiting with the agent started meanwhile: %+v, %v", resp, err)
		}
	})
	t.Run("NoAgentWithinTheBound", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), SocketName)
		start := time.Now()
		_, err := AskWaiting(ctx, path, Request{Op: OpLANList}, 300*time.Millisecond)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeNoAgent || !e.Retry || !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), "waited") || !strings.Contains(err.Error(), nodelocal.AgentWaitEnv) {
			t.Fatalf("no agent: %v, want CodeNoAgent naming the socket, the wait and %s", err, nodelocal.AgentWaitEnv)
		}
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Fatalf("gave up after %s, before the bound", took)
		}
	})
	t.Run("RefusalAtOnce", func(t *testing.T) {
		path := serve(t, &book{})
		start := time.Now()
		_, err := AskWaiting(ctx, path, Request{Op: OpLANPod, Network: "n", Pod: &Pod{Namespace: "ns", Name: "no"}}, time.Hour)
		if ErrorCode(err) != CodeRefused || time.Since(start) > time.Minute {
			t.Fatalf("refusal: %v (code %q) after %s, want CodeRefused at once", err, ErrorCode(err), time.Since(start))
		}
	})
}

// pollCond polls cond every 10 ms, within a minute.
func pollCond(cond func() bool) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return nil
		}
	}
	return errors.New("condition not met within a minute")
}
