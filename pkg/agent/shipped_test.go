package agent

import (
	"path/filepath"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// TestAgentLoadsShippedConflists: villaged (run, sync, status) reads every
// shipped example, cniVersions list included.
func TestAgentLoadsShippedConflists(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "conf", "*village*.conflist"))
	if len(files) < 5 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, err := Load(Options{ConfFile: f, NodeName: "node1"})
			if err != nil {
				t.Fatal(err)
			}
			if c.Net.Name == "" || c.Net.Bridge == "" {
				t.Fatalf("network %q bridge %q", c.Net.Name, c.Net.Bridge)
			}
		})
	}
}
