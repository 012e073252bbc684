package nodelocal_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		{nodelocal.PolicyModel("", "ovl"), "/env/run/ovl/policy-model.json"},
		{nodelocal.PolicyDrops("", "ovl"), "/env/run/ovl/policy-drops.json"},
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

// TestPublishedKubeconfigWaits: a Kubernetes pod's ADD that comes between
// the agent's node name and its credentials (after a reboot) waits for the
// kubeconfig instead of failing; at the bound it fails naming the path.
func TestPublishedKubeconfigWaits(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(nodelocal.RunDirEnv, dir)
	t.Setenv("CNI_COMMAND", "ADD")
	t.Setenv("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p")
	want := filepath.Join(dir, "kube", "kubeconfig")

	t.Setenv(nodelocal.AgentWaitEnv, "0s")
	if _, err := nodelocal.PublishedKubeconfig(); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("none published within the bound: %v; want an error naming %s and the wait", err, want)
	}

	t.Setenv(nodelocal.AgentWaitEnv, "5m")
	written := make(chan error, 1)
	go func() {
		// The agent's TokenRequest answered a moment after the ADD began.
		time.Sleep(3 * nodelocal.AgentPoll)
		written <- nodelocal.WriteFile(want, []byte("apiVersion: v1\n"), 0o600)
	}()
	got, err := nodelocal.PublishedKubeconfig()
	if werr := <-written; werr != nil {
		t.Fatal(werr)
	}
	if err != nil || got != want {
		t.Fatalf("published during the wait: %q, %v; want %s", got, err, want)
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

// No silent host-name fallback for a Kubernetes pod's ADD: without a
// published name or $NODE_NAME it waits for the agent's name within
// AgentWait, then fails naming the file; other uses keep the host name.
func TestNodeNameKubernetesADD(t *testing.T) {
	h, err := nodelocal.HostNodeName()
	if err != nil {
		t.Fatal(err)
	}
	const k8s = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=db-0;K8S_POD_INFRA_CONTAINER_ID=abc"
	for _, tc := range []struct {
		name, command, args, env, published string
		want                                string
		wantErr                             bool
	}{
		{name: "standalone ADD", command: "ADD", args: "", want: h},
		{name: "standalone ADD with VILLAGE_LAN", command: "ADD", args: "VILLAGE_LAN=true", want: h},
		{name: "Kubernetes DEL records no name", command: "DEL", args: k8s, want: h},
		{name: "Kubernetes ADD, empty pod name", command: "ADD", args: "K8S_POD_NAME=", want: h},
		{name: "Kubernetes ADD, nothing published", command: "ADD", args: k8s, wantErr: true},
		{name: "Kubernetes ADD, $NODE_NAME", command: "ADD", args: k8s, env: "from-env", want: "from-env"},
		{name: "Kubernetes ADD, published", command: "ADD", args: k8s, published: "agent-node", want: "agent-node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(nodelocal.RunDirEnv, t.TempDir())
			t.Setenv(nodelocal.AgentWaitEnv, "300ms")
			t.Setenv("CNI_COMMAND", tc.command)
			t.Setenv("CNI_ARGS", tc.args)
			t.Setenv("NODE_NAME", tc.env)
			if tc.published != "" {
				if err := nodelocal.PublishNodeName("", "ovl", tc.published); err != nil {
					t.Fatal(err)
				}
			}
			got, err := nodelocal.NodeName("ovl")
			if tc.wantErr {
				if !errors.Is(err, nodelocal.ErrNodeNameNotPublished) || !strings.Contains(err.Error(), nodelocal.NodeNameFile("", "ovl")) || !strings.Contains(err.Error(), "300ms") {
					t.Fatalf("NodeName = %q, %v; want ErrNodeNameNotPublished naming the file and the bound", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NodeName = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// A Kubernetes pod's ADD that starts before the agent gets the name the
// agent publishes while it waits.
func TestNodeNameWaitsForTheAgent(t *testing.T) {
	t.Setenv(nodelocal.RunDirEnv, t.TempDir())
	t.Setenv(nodelocal.AgentWaitEnv, "1m")
	t.Setenv("CNI_COMMAND", "ADD")
	t.Setenv("CNI_ARGS", "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=db-0")
	t.Setenv("NODE_NAME", "")
	type answer struct {
		name string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		n, err := nodelocal.NodeName("ovl")
		done <- answer{n, err}
	}()
	if err := nodelocal.PublishNodeName("", "ovl", "late-agent"); err != nil {
		t.Fatal(err)
	}
	if a := <-done; a.err != nil || a.name != "late-agent" {
		t.Fatalf("NodeName = %q, %v; want the name published during the wait", a.name, a.err)
	}
}

func TestAgentWait(t *testing.T) {
	for v, want := range map[string]time.Duration{"": nodelocal.DefaultAgentWait, "2s": 2 * time.Second, "0s": 0} {
		t.Setenv(nodelocal.AgentWaitEnv, v)
		if got, err := nodelocal.AgentWait(); err != nil || got != want {
			t.Errorf("%s=%q: %v, %v; want %v", nodelocal.AgentWaitEnv, v, got, err, want)
		}
	}
	for _, bad := range []string{"2", "-1s", "soon"} {
		t.Setenv(nodelocal.AgentWaitEnv, bad)
		if _, err := nodelocal.AgentWait(); err == nil || !strings.Contains(err.Error(), nodelocal.AgentWaitEnv) {
			t.Errorf("%s=%q: %v, want an error naming the variable", nodelocal.AgentWaitEnv, bad, err)
		}
	}
}

// ReadJSON: a missing file is not found and no error, a file decodes,
// and one that does not decode is an error naming it.
func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	if err := os.WriteFile(good, []byte(`{"a":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"a":`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path      string
		found     bool
		errNaming bool
		a         int
	}{
		{filepath.Join(dir, "missing.json"), false, false, 0},
		{good, true, false, 1},
		{bad, false, true, 0},
	} {
		var v struct{ A int }
		found, err := nodelocal.ReadJSON(tc.path, &v)
		if found != tc.found || (err != nil) != tc.errNaming || v.A != tc.a {
			t.Errorf("ReadJSON(%s) = %v, %v, a=%d; want %v, error %v, a=%d", tc.path, found, err, v.A, tc.found, tc.errNaming, tc.a)
		}
		if err != nil && !strings.Contains(err.Error(), tc.path) {
			t.Errorf("ReadJSON(%s): error %q does not name the file", tc.path, err)
		}
	}
}
