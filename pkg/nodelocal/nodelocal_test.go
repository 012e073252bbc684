package nodelocal_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/nodelocal"
)

func TestPaths(t *testing.T) {
	t.Setenv(nodelocal.RunDirEnv, "/env/run")
	for _, tc := range []struct{ got, want string }{
		{nodelocal.SubnetFile("", "ovl"), "/env/run/ovl/subnet"},
		{nodelocal.SubnetFile("/flag", "ovl"), "/flag/ovl/subnet"},
		{nodelocal.NodeNameFile("", "ovl"), "/env/run/ovl/node-name"},
		{nodelocal.PolicyNamespaces("", "ovl"), "/env/run/ovl/policy-namespaces"},
		{nodelocal.PolicyStatus("", "ovl"), "/env/run/ovl/policy-status.json"},
		{nodelocal.AgentSocket(""), "/env/run/agent.sock"},
		{nodelocal.SpoofDir("", "ovl"), "/env/run/macspoofchk/ovl"},
		{nodelocal.HostKubeconfig(""), "/env/run/kube/kubeconfig"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	t.Setenv(nodelocal.RunDirEnv, "")
	if got := nodelocal.AgentSocket(""); got != "/run/village/agent.sock" {
		t.Errorf("AgentSocket without the variable = %s", got)
	}
}

// The stores' node name: the agent's published one first, else the agent's
// own default ($NODE_NAME, else the host name in lower case).
func TestNodeName(t *testing.T) {
	t.Setenv(nodelocal.RunDirEnv, t.TempDir())
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "")
	if got, err := nodelocal.NodeName("ovl"); err != nil || got != strings.ToLower(h) {
		t.Errorf("nothing published, no $NODE_NAME: %q, %v; want the host name %q", got, err, strings.ToLower(h))
	}
	t.Setenv("NODE_NAME", "from-env")
	if got, err := nodelocal.NodeName("ovl"); err != nil || got != "from-env" {
		t.Errorf("nothing published: %q, %v; want $NODE_NAME", got, err)
	}
	if err := nodelocal.PublishNodeName("", "ovl", "agent-node"); err != nil {
		t.Fatal(err)
	}
	if got, err := nodelocal.NodeName("ovl"); err != nil || got != "agent-node" {
		t.Errorf("published: %q, %v; want the agent's name", got, err)
	}
	if got, _ := nodelocal.NodeName("other"); got != "from-env" {
		t.Errorf("another network's name leaked: %q", got)
	}
}

func TestPublishedKubeconfig(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(nodelocal.RunDirEnv, dir)
	want := filepath.Join(dir, "kube", "kubeconfig")
	if _, err := nodelocal.PublishedKubeconfig(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("none published: %v; want an error naming %s", err, want)
	}
	if err := nodelocal.WriteFile(want, []byte("apiVersion: v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := nodelocal.PublishedKubeconfig(); err != nil || got != want {
		t.Fatalf("published: %q, %v", got, err)
	}
}

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "f")
	for _, content := range []string{"one\n", "two, longer\n", ""} {
		if err := nodelocal.WriteFile(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != content {
			t.Fatalf("holds %q (%v), want %q", b, err, content)
		}
		fi, _ := os.Stat(path)
		if fi.Mode().Perm() != 0o640 {
			t.Errorf("mode %v, want 0640", fi.Mode().Perm())
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*"+nodelocal.TempInfix+"*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// A directory in the way: the error names the path, nothing is left.
	if err := os.Mkdir(path+"d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path+"d", "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := nodelocal.WriteFile(path+"d", []byte("x"), 0o644); err == nil || !strings.Contains(err.Error(), path+"d") {
		t.Errorf("rename over a non-empty directory: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*"+nodelocal.TempInfix+"*")); len(left) != 0 {
		t.Errorf("temporary files left after a failure: %v", left)
	}
}

func TestHostNodeName(t *testing.T) {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := nodelocal.HostNodeName(); err != nil || got != strings.ToLower(h) {
		t.Fatalf("HostNodeName() = %q, %v; want %q", got, err, strings.ToLower(h))
	}
}
