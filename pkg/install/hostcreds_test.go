package install

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/village-cni/village/pkg/nodelocal"
)

// Uninstall removes the LAN pool's host token and kubeconfig the agent
// keeps under <run dir>/kube/ (it removes them itself on SIGTERM; one
// killed leaves them), and leaves the rest of the run directory alone.
func TestUninstallRemovesHostCreds(t *testing.T) {
	s := newSandbox(t)
	mustInstall(t, s.opts())
	run := filepath.Join(s.root, "run")
	dir := nodelocal.HostCredsDir(run)
	must(t, os.MkdirAll(dir, 0o700))
	for _, f := range []string{"token", "ca.crt", "kubeconfig"} {
		must(t, os.WriteFile(filepath.Join(dir, f), []byte(f), 0o600))
	}
	other := nodelocal.NodeNameFile(run, "village")
	must(t, nodelocal.PublishNodeName(run, "village", "node1"))

	u, err := Uninstall(UninstallOptions{StateDir: s.state, RunDir: run})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s after uninstall: %v, want it gone", dir, err)
	}
	if actions(u)[dir] != Removed {
		t.Errorf("uninstall report on %s: %q, want removed\n%s", dir, actions(u)[dir], u)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("uninstall took %s too: %v", other, err)
	}
}
