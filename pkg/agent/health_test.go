package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/metrics"
)

// TestProbes: liveness holds while the agent waits; readiness needs the
// subnet, a good last reconcile and the conflist on disk.
func TestProbes(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "10-village.conflist")
	if err := os.WriteFile(conf, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &agent{c: &Conf{File: conf}, health: newHealth("node1")}
	p := a.probes()
	if err := p.Live(); err != nil {
		t.Errorf("liveness while waiting for the subnet: %v", err)
	}
	if err := p.Ready(); err == nil || !strings.Contains(err.Error(), "node node1 holds no pod subnet") {
		t.Errorf("readiness before the subnet: %v", err)
	}
	a.health.set(nil)
	if err := p.Ready(); err != nil {
		t.Errorf("readiness with subnet, reconcile and conflist: %v", err)
	}
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}
	if err := p.Ready(); err == nil || !strings.Contains(err.Error(), conf) {
		t.Errorf("readiness without the conflist: %v", err)
	}
	if err := p.Live(); err != nil {
		t.Errorf("liveness without the conflist: %v", err)
	}
}

// TestPublishConf: the staged conflist is copied into the config directory
// under its own name, once; a second call with the same bytes changes
// nothing, and readiness looks at the published copy.
func TestPublishConf(t *testing.T) {
	stage, confDir := t.TempDir(), t.TempDir()
	staged := filepath.Join(stage, "10-village.conflist")
	if err := os.WriteFile(staged, []byte(`{"name":"village"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &agent{c: &Conf{File: staged}, opts: Options{PublishConfDir: confDir}, health: newHealth("node1")}
	a.health.set(nil)
	if err := a.probes().Ready(); err == nil {
		t.Error("ready before the conflist is published")
	}
	for i, want := range []bool{true, false} {
		published, err := a.c.publishConf(confDir, t.Logf)
		if err != nil || published != want {
			t.Fatalf("publish %d: published %v, %v; want %v", i, published, err, want)
		}
	}
	b, err := os.ReadFile(filepath.Join(confDir, "10-village.conflist"))
	if err != nil || string(b) != `{"name":"village"}` {
		t.Fatalf("published conflist: %q %v", b, err)
	}
	if entries, _ := os.ReadDir(confDir); len(entries) != 1 {
		t.Errorf("config directory holds %d files, want the conflist only", len(entries))
	}
	if err := a.probes().Ready(); err != nil {
		t.Errorf("not ready with the published conflist: %v", err)
	}
}

// clock is a test clock the health check reads instead of the time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestLivenessStuckLoop: /healthz is ok before the loop runs (the agent may
// wait for its subnet for long) and while the loop comes round; once the
// real loop stalls inside its periodic work for longer than liveBound, it
// answers 503 naming the stuck loop, and ok again when the loop moves on.
func TestLivenessStuckLoop(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := &agent{opts: Options{Period: time.Millisecond}, health: newHealth("node1")}
	a.health.now = clk.now
	srv := httptest.NewServer(metrics.New().Handler(a.probes()))
	t.Cleanup(srv.Close)
	healthz := func() (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	clk.add(time.Hour) // waiting for the subnet is not being stuck
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("healthz before the loop: %d %s", code, body)
	}

	stalled, release, resumed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	ticks := 0
	a.onTick = func() { // runs on the loop's goroutine only
		ticks++
		switch ticks {
		case 2:
			close(stalled)
			<-release
		case 3:
			close(resumed)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.loop(ctx, nil, nil, nil) }()
	t.Cleanup(func() { cancel(); <-done })

	<-stalled // the loop is inside its second tick and stays there
	bound := liveBound(a.opts.Period)
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("healthz with the loop just stalled: %d %s", code, body)
	}
	clk.add(bound)
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("healthz at the bound: %d %s", code, body)
	}
	clk.add(time.Second)
	if code, body := healthz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "reconcile loop has not come round") {
		t.Fatalf("healthz with the loop stuck past %s: %d %s", bound, code, body)
	}
	close(release)
	<-resumed // the loop came round again (and beat before this tick)
	if code, body := healthz(); code != http.StatusOK {
		t.Fatalf("healthz after the loop moved on: %d %s", code, body)
	}
}

// TestPublishConfKeepsForeignFile: a file of the conflist's name that
// Village did not write (another network's, not a village one, not JSON) is
// moved to a backup name no runtime loads, with its bytes, and logged; an
// earlier Village conflist of the same network is replaced in place.
func TestPublishConfKeepsForeignFile(t *testing.T) {
	staged := filepath.Join(t.TempDir(), "10-village.conflist")
	ours := `{"cniVersion":"1.1.0","name":"village","plugins":[{"type":"village","bridge":"village0"}]}`
	if err := os.WriteFile(staged, []byte(ours), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Conf{File: staged}
	for _, tc := range []struct {
		what, old string
		foreign   bool
	}{
		{"hand-written bridge conflist", `{"cniVersion":"1.0.0","name":"mynet","plugins":[{"type":"bridge"}]}`, true},
		{"same name, no village plugin", `{"cniVersion":"1.0.0","name":"village","plugins":[{"type":"bridge"}]}`, true},
		{"not JSON", "# hand notes\n", true},
		{"earlier Village conflist", `{"cniVersion":"1.0.0","name":"village","plugins":[{"type":"village","mtu":1400}]}`, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			dir := t.TempDir()
			dst := filepath.Join(dir, "10-village.conflist")
			if err := os.WriteFile(dst, []byte(tc.old), 0o600); err != nil {
				t.Fatal(err)
			}
			var logged []string
			published, err := c.publishConf(dir, func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) })
			if err != nil || !published {
				t.Fatalf("publish over %s: published %v, %v", tc.what, published, err)
			}
			if b, err := os.ReadFile(dst); err != nil || string(b) != ours {
				t.Fatalf("published conflist %q, %v", b, err)
			}
			backups, _ := filepath.Glob(dst + ".village-backup-*")
			if !tc.foreign {
				if len(backups) != 0 || len(logged) != 1 || !strings.Contains(logged[0], "replacing") {
					t.Errorf("earlier conflist: backups %v, log %q; want none and one replacing line", backups, logged)
				}
				return
			}
			if len(backups) != 1 {
				t.Fatalf("backups %v, want one", backups)
			}
			if b, err := os.ReadFile(backups[0]); err != nil || string(b) != tc.old {
				t.Errorf("backup holds %q, %v; want the hand-written %q", b, err, tc.old)
			}
			if ext := filepath.Ext(backups[0]); ext == ".conf" || ext == ".conflist" || ext == ".json" {
				t.Errorf("backup %s has an extension CNI runtimes load", backups[0])
			}
			if len(logged) != 1 || !strings.Contains(logged[0], "not written by Village") || !strings.Contains(logged[0], backups[0]) {
				t.Errorf("log %q: want one line naming the backup", logged)
			}
			// Published now: the next start changes nothing and backs up nothing.
			if published, err := c.publishConf(dir, t.Logf); err != nil || published {
				t.Errorf("second publish: %v, %v", published, err)
			}
			if again, _ := filepath.Glob(dst + ".village-backup-*"); len(again) != 1 {
				t.Errorf("second publish made backups %v", again)
			}
		})
	}
}
