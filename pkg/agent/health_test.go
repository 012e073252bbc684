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
