package pluginexec

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// plugin writes an executable shell script named name into dir.
func plugin(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFind(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	want := plugin(t, b, "p", "true")
	if err := os.Mkdir(filepath.Join(a, "p"), 0o755); err != nil { // a directory is not a plugin
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
		ok               bool
	}{
		{"p", a + ":" + b, want, true},
		{"p", b, want, true},
		{"p", a, "", false},
		{"missing", a + ":" + b, "", false},
		{"", b, "", false},
		{"../b/p", a, "", false},
	} {
		got, err := Find(tc.name, tc.path)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Find(%q, %q) = %q, %v; want %q (ok %v)", tc.name, tc.path, got, err, tc.want, tc.ok)
		}
	}
}

func TestEnv(t *testing.T) {
	t.Setenv("CNI_COMMAND", "ADD")
	t.Setenv("CNI_IFNAME", "eth0")
	t.Setenv("CNI_NETNS", "/run/netns/x")
	env := Env("DEL", "CNI_IFNAME=net1", "CNI_ARGS=")
	count := func(k string) (n int, last string) {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				n++
				last = kv
			}
		}
		return
	}
	for _, tc := range []struct{ key, want string }{
		{"CNI_COMMAND", "CNI_COMMAND=DEL"},
		{"CNI_IFNAME", "CNI_IFNAME=net1"},
		{"CNI_NETNS", "CNI_NETNS=/run/netns/x"},
		{"CNI_ARGS", "CNI_ARGS="},
	} {
		if n, got := count(tc.key); n != 1 || got != tc.want {
			t.Errorf("%s: %d entries, %q; want one, %q", tc.key, n, got, tc.want)
		}
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	conf := []byte(`{"cniVersion":"1.0.0","name":"n","type":"p"}`)
	for _, tc := range []struct {
		name, body string
		wantIP     string // a result with this address
		wantCode   uint   // a CNI error with this code
		wantMsg    string
	}{
		{"result", `cat >/dev/null; echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}]}'`, "10.1.0.2/24", 0, ""},
		{"old result without version", `cat >/dev/null; echo '{"ips":[{"address":"10.1.0.3/24"}]}'`, "10.1.0.3/24", 0, ""},
		{"env reaches the plugin", `cat >/dev/null; echo "{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"$ADDR/24\"}]}"; [ "$CNI_COMMAND" = ADD ]`, "10.1.0.4/24", 0, ""},
		{"stdin reaches the plugin", `grep -q '"name":"n"' || exit 3; echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24"}]}'`, "10.1.0.5/24", 0, ""},
		{"CNI error", `echo '{"cniVersion":"1.0.0","code":11,"msg":"busy"}'; exit 1`, "", 11, "busy"},
		{"stderr only", `echo oops >&2; exit 2`, "", 0, "oops"},
		{"no output", `exit 2`, "", 0, "no error message"},
		{"garbage", `echo '{not json'; exit 1`, "", 0, "error parsing its diagnostic message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := plugin(t, dir, strings.ReplaceAll(tc.name, " ", "-"), tc.body)
			res, err := Call{Path: p, Command: "ADD", Env: []string{"ADDR=10.1.0.4"}, Stdin: conf}.Result(context.Background())
			if tc.wantIP != "" {
				if err != nil {
					t.Fatal(err)
				}
				if res.Version() != "1.0.0" {
					t.Fatalf("result version %s, want the configuration's 1.0.0", res.Version())
				}
				r, err := current.NewResultFromResult(res)
				if err != nil {
					t.Fatal(err)
				}
				if len(r.IPs) != 1 || r.IPs[0].Address.String() != tc.wantIP {
					t.Fatalf("result %+v, want one address %s", r, tc.wantIP)
				}
				return
			}
			var e *types.Error
			if !errors.As(err, &e) || e.Code != tc.wantCode || !strings.Contains(e.Msg, tc.wantMsg) {
				t.Fatalf("error %#v, want code %d with %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
	if !slices.Contains(Env("ADD"), "CNI_COMMAND=ADD") {
		t.Fatal("Env lacks CNI_COMMAND")
	}
}

func TestRunKilledWhenContextEnds(t *testing.T) {
	p := plugin(t, t.TempDir(), "hang", "exec sleep 60")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Call{Path: p, Command: "ADD", Stdin: []byte(`{}`)}.Run(ctx)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the deadline", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("Run returned after %s: the plugin was not killed", d)
	}
}

// TestAbortBeforeSend: a plugin started but never sent its configuration
// reads nothing of it, and Abort leaves no process behind.
func TestAbortBeforeSend(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "stdin")
	started := filepath.Join(dir, "started")
	p := plugin(t, dir, "p", "exec >"+got+"; touch "+started+"; exec cat")
	proc, err := Call{Path: p, Command: "ADD", Stdin: []byte(`{"cniVersion":"1.0.0","name":"secret"}`)}.Start()
	if err != nil {
		t.Fatal(err)
	}
	// The plugin runs (up to its read of stdin) before Send or Abort.
	waitFor(t, func() bool { _, err := os.Stat(started); return err == nil })
	pid := proc.pid
	proc.Abort()
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Fatalf("plugin %d still there after Abort (kill 0: %v)", pid, err)
	}
	b, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 0 {
		t.Fatalf("an aborted plugin read %q", b)
	}
	proc.Abort() // again: nothing
}

// TestOutputBeforeExit: Output returns the result as soon as the plugin
// closes its stdout, while it still runs; the result counts only through
// Wait, which reports how the plugin ended.
func TestOutputBeforeExit(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	for _, tc := range []struct {
		name, exit string
		ok         bool
	}{{"exits 0", "exit 0", true}, {"fails after printing", "echo late >&2; exit 3", false}} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(gate)
			p := plugin(t, dir, strings.ReplaceAll(tc.name, " ", "-"), `cat >/dev/null
echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.9/24"}]}'
exec 1>&-
while [ ! -e `+gate+` ]; do sleep 0.01; done
`+tc.exit)
			proc, err := Call{Path: p, Command: "ADD", Stdin: []byte(`{"cniVersion":"1.0.0"}`)}.Start()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := proc.Output(ctx) // would wait forever if it waited for the exit
			if err != nil {
				t.Fatal(err)
			}
			if r, err := current.NewResultFromResult(res); err != nil || len(r.IPs) != 1 || r.IPs[0].Address.String() != "10.1.0.9/24" {
				t.Fatalf("result %v (%v)", res, err)
			}
			if err := syscall.Kill(proc.pid, 0); err != nil {
				t.Fatalf("the plugin should still run: %v", err)
			}
			must(t, os.WriteFile(gate, nil, 0o600))
			err = proc.Wait()
			if tc.ok != (err == nil) {
				t.Fatalf("Wait: %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok && !strings.Contains(err.Error(), "late") {
				t.Fatalf("Wait: %v, want the plugin's stderr", err)
			}
			if err2 := proc.Wait(); err2 != err && err2.Error() != err.Error() {
				t.Fatalf("second Wait: %v, first %v", err2, err)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within a minute")
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
