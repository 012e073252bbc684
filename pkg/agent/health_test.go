package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		published, err := a.c.publishConf(confDir)
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
