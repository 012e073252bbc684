package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestREST(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	for _, c := range []struct {
		path, host, err string
	}{
		{path: good, host: "https://10.0.0.1:6443"},
		{path: filepath.Join(dir, "missing"), err: "kubeconfig " + filepath.Join(dir, "missing")},
		{path: "", err: "not in a pod"},
	} {
		rc, err := REST(c.path)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("REST(%q) = %v, want an error containing %q", c.path, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("REST(%q): %v", c.path, err)
		case c.err == "" && rc.Host != c.host:
			t.Errorf("REST(%q).Host = %q, want %q", c.path, rc.Host, c.host)
		}
	}
}
