package kube

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/nodelocal"
)

// An empty kubeconfig means the one the agent publishes on the host; with
// none published the error names where it was looked for (in-cluster
// credentials never exist for a plugin on the host).
func TestKubeconfigFromAgent(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(nodelocal.RunDirEnv, dir)
	want := filepath.Join(dir, "kube", "kubeconfig")
	_, err := New(Options{Network: "lan", NodeName: "n1"})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("nothing published: %v; want an error naming %s", err, want)
	}
	kc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`
	if err := nodelocal.WriteFile(want, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := nodelocal.PublishNodeName("", "lan", "agent-node"); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Network: "lan"})
	if err != nil {
		t.Fatalf("published kubeconfig: %v", err)
	}
	if !strings.Contains(s.where, "127.0.0.1:1") || s.node != "agent-node" {
		t.Errorf("store at %s as node %q; want the published kubeconfig's server and node name", s.where, s.node)
	}
}
