package helm

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	binsOnce sync.Once
	binsDir  string
	binsErr  error
)

// bins returns a directory of Village's built binaries: $VILLAGE_BIN_DIR
// (./build_linux.sh's ./bin, as scripts/test.sh sets it), else a fresh
// build of the checkout with build_linux.sh's tags.
func bins(t *testing.T) string {
	t.Helper()
	binsOnce.Do(func() {
		if d := os.Getenv("VILLAGE_BIN_DIR"); d != "" {
			binsDir, binsErr = filepath.Abs(d)
			return
		}
		if binsDir, binsErr = os.MkdirTemp("", "village-helm-testbin-"); binsErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", binsDir+"/", "./plugins/...", "./cmd/...")
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binsErr = &buildError{err: err, out: out}
		}
	})
	if binsErr != nil {
		t.Fatalf("building Village's binaries: %v", binsErr)
	}
	return binsDir
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

// distro is a distribution's CNI layout and pod range, and the values
// that select them.
type distro struct {
	name        string
	valuesFiles []string
	binDir      string
	confDir     string
	podCIDR     string
}

// TestK3sValues: values-k3s.yaml puts the plugins and the conflist where
// k3s's containerd looks, and uses k3s's default pod range.
func TestK3sValues(t *testing.T) {
	testDistro(t, distro{name: "k3s", valuesFiles: []string{"values-k3s.yaml"},
		binDir: "/var/lib/rancher/k3s/data/current/bin", confDir: "/var/lib/rancher/k3s/agent/etc/cni/net.d", podCIDR: "10.42.0.0/16"})
}

// TestKubeadmValues: the default values are kubeadm's layout (the
// runtime's defaults, /opt/cni/bin and /etc/cni/net.d).
func TestKubeadmValues(t *testing.T) {
	testDistro(t, distro{name: "kubeadm", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", podCIDR: "10.244.0.0/16"})
}

// testDistro checks that the rendered DaemonSet mounts d's directories from
// the host at the same paths and points villaged install and villaged run at
// them, then runs the rendered init container's `villaged install`, with its
// arguments and environment, against a temporary root standing for the
// host, and finds the files where d's runtime looks for them.
func testDistro(t *testing.T, d distro) {
	docs := render(t, d.valuesFiles, nil)
	ds := daemonSet(t, docs)
	spec := &ds.Spec.Template.Spec
	inst := container(t, spec.InitContainers, "install")
	agent := container(t, spec.Containers, "agent")

	if len(inst.Command) < 2 || inst.Command[0] != "villaged" || inst.Command[1] != "install" {
		t.Fatalf("init container runs %v, want villaged install", inst.Command)
	}
	args := inst.Command[2:]
	if got := flagValue(args, "--cni-bin-dir"); got != d.binDir {
		t.Errorf("villaged install --cni-bin-dir %q, want %s", got, d.binDir)
	}
	if got := flagValue(args, "--cni-conf-dir"); got != d.confDir {
		t.Errorf("villaged install --cni-conf-dir %q, want %s", got, d.confDir)
	}
	if got := flagValue(agent.Command, "--publish-conf-dir"); got != d.confDir {
		t.Errorf("villaged run --publish-conf-dir %q, want %s", got, d.confDir)
	}
	for _, m := range []struct {
		c    string
		path string
	}{{"install", d.binDir}, {"install", d.confDir}, {"agent", d.confDir}} {
		c := inst
		if m.c == "agent" {
			c = agent
		}
		host, writable := hostPathAt(t, spec, c, m.path)
		if host != m.path || !writable {
			t.Errorf("%s: %s is the host's %s (writable %v), want the host's %s writable", m.c, m.path, host, writable, m.path)
		}
	}
	env := map[string]string{}
	for _, e := range inst.Env {
		switch {
		case e.Value != "":
			env[e.Name] = e.Value
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = "node-1"
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP":
			env[e.Name] = "192.0.2.10"
		}
	}
	if env["CLUSTER_CIDR"] != d.podCIDR {
		t.Errorf("install CLUSTER_CIDR %q, want %s", env["CLUSTER_CIDR"], d.podCIDR)
	}

	// The host: a temporary root; every absolute path the init container
	// names lives under it, the ConfigMap's template at the path it is
	// mounted at.
	root := t.TempDir()
	tmplPath := filepath.Join(root, flagValue(args, "--conf"))
	if err := os.MkdirAll(filepath.Dir(tmplPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmplPath, []byte(conflistTemplate(t, docs)), 0o644); err != nil {
		t.Fatal(err)
	}
	var run []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "/"):
			a = filepath.Join(root, a)
		case a == "$(NODE_NAME)":
			a = env["NODE_NAME"]
		}
		run = append(run, a)
	}
	built := bins(t)
	run = append(run, "--bin-source", built)
	cmd := exec.Command(filepath.Join(built, "villaged"), append([]string{"install"}, run...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("villaged install %s: %v\n%s", strings.Join(run, " "), err, out)
	}
	t.Logf("%s: villaged install %s\n%s", d.name, strings.Join(run, " "), out)

	// The plugins, byte for byte, in the distribution's binary directory.
	for _, b := range []string{"village", "village-ipam", "loopback"} {
		got, err := os.ReadFile(filepath.Join(root, d.binDir, b))
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		want, _ := os.ReadFile(filepath.Join(built, b))
		if !bytes.Equal(got, want) {
			t.Errorf("%s in %s differs from the built binary", b, d.binDir)
		}
	}
	// The conflist is staged for the agent, which publishes it into the
	// distribution's config directory (install made it and recorded the
	// published path for `villaged uninstall`).
	staged, err := os.ReadFile(filepath.Join(root, flagValue(args, "--stage-dir"), "10-village.conflist"))
	if err != nil {
		t.Fatalf("the staged conflist: %v", err)
	}
	var list struct {
		Plugins []struct {
			Type        string `json:"type"`
			ClusterCIDR string `json:"clusterCIDR"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(staged, &list); err != nil || len(list.Plugins) == 0 || list.Plugins[0].Type != "village" {
		t.Fatalf("staged conflist (%v):\n%s", err, staged)
	}
	if list.Plugins[0].ClusterCIDR != d.podCIDR {
		t.Errorf("staged conflist clusterCIDR %q, want %s", list.Plugins[0].ClusterCIDR, d.podCIDR)
	}
	if fi, err := os.Stat(filepath.Join(root, d.confDir)); err != nil || !fi.IsDir() {
		t.Errorf("install did not make the config directory %s: %v", d.confDir, err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, flagValue(args, "--state-dir"), "install.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(root, d.binDir, "village"), filepath.Join(root, d.confDir, "10-village.conflist")} {
		if !bytes.Contains(manifest, []byte(`"`+p+`"`)) {
			t.Errorf("install.json does not record %s:\n%s", p, manifest)
		}
	}
	// Nothing in the other layout's directories.
	for _, other := range []string{"/opt/cni/bin", "/etc/cni/net.d", "/var/lib/rancher"} {
		if strings.HasPrefix(d.binDir, other) || strings.HasPrefix(d.confDir, other) {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, other)); err == nil {
			t.Errorf("%s: install wrote into %s", d.name, other)
		}
	}
}
