package install

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sandbox is a fresh machine's file system: a source directory with fake
// binaries, and empty CNI and state directories.
type sandbox struct {
	root, src, bin, conf, state string
}

func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	root := t.TempDir()
	s := &sandbox{root: root, src: filepath.Join(root, "src"), bin: filepath.Join(root, "opt/cni/bin"),
		conf: filepath.Join(root, "etc/cni/net.d"), state: filepath.Join(root, "var/lib/village")}
	if err := os.MkdirAll(s.src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range append(slices.Clone(Plugins), "villaged") {
		s.writeSrc(t, b, "#!binary "+b+" v1\n")
	}
	return s
}

func (s *sandbox) writeSrc(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.src, name), []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func (s *sandbox) opts() Options {
	return Options{BinDir: s.bin, ConfDir: s.conf, StateDir: s.state, BinSource: s.src,
		LookupEnv: func(string) (string, bool) { return "", false },
		NodeVars:  map[string]string{"NODE_NAME": "node1", "DEFAULT_IFACE": "eth9", "NODE_IP": "192.0.2.10"}}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustInstall(t *testing.T, o Options) *Report {
	t.Helper()
	r, err := Install(o)
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	return r
}

func actions(r *Report) map[string]Action {
	m := map[string]Action{}
	for _, c := range r.Changes {
		m[c.Path] = c.Action
	}
	return m
}

func TestInstallFreshIdempotentUninstall(t *testing.T) {
	s := newSandbox(t)
	// Another plugin and another network that must be left alone.
	must(t, os.MkdirAll(s.bin, 0o755))
	must(t, os.MkdirAll(s.conf, 0o755))
	must(t, os.WriteFile(filepath.Join(s.bin, "portmap"), []byte("ref portmap"), 0o755))
	must(t, os.WriteFile(filepath.Join(s.bin, "bandwidth"), []byte("ref bandwidth"), 0o755))
	must(t, os.WriteFile(filepath.Join(s.conf, "50-other.conflist"), []byte(`{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"portmap"}]}`), 0o644))

	r := mustInstall(t, s.opts())
	a := actions(r)
	for _, p := range []string{"village", "village-ipam", "village-ipam-etcd", "village-ipam-kube", "loopback"} {
		path := filepath.Join(s.bin, p)
		if a[path] != Created {
			t.Errorf("%s: %s, want created", path, a[path])
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: mode %v %v", path, fi.Mode(), err)
		}
		if read(t, path) != "#!binary "+p+" v1\n" {
			t.Errorf("%s content", path)
		}
	}
	if _, err := os.Stat(filepath.Join(s.bin, "villaged")); err == nil {
		t.Error("villaged installed without being asked")
	}
	confPath := filepath.Join(s.conf, DefaultConfName)
	if a[confPath] != Created {
		t.Errorf("conflist: %s", a[confPath])
	}
	conf := read(t, confPath)
	if !strings.Contains(conf, `"subnet": "10.244.1.0/24"`) || strings.Contains(conf, "${") {
		t.Errorf("rendered conflist:\n%s", conf)
	}
	if len(r.Warnings) != 0 {
		t.Errorf("warnings on a clean install: %v", r.Warnings)
	}
	assertNoTemp(t, s.bin, s.conf, s.state)

	// Second run: nothing changes.
	r2 := mustInstall(t, s.opts())
	if r2.Changed() {
		t.Errorf("second install changed something:\n%s", r2)
	}
	if !strings.Contains(r2.String(), "nothing changed") {
		t.Errorf("report: %s", r2)
	}

	m, err := LoadManifest(s.state)
	if err != nil || len(m.Files) != len(Plugins)+1 || len(m.Networks) != 1 || m.Networks[0].Name != "village" || !slices.Equal(m.Networks[0].Bridges, []string{"village0"}) {
		t.Fatalf("manifest %+v %v", m, err)
	}

	u, err := Uninstall(UninstallOptions{StateDir: s.state, RunDir: s.root + "/run"})
	if err != nil {
		t.Fatal(err)
	}
	if u.Changes[0].Path != confPath || u.Changes[0].Action != Removed {
		t.Errorf("uninstall must take the conflist away first: %+v", u.Changes)
	}
	left := listDir(t, s.bin)
	if !slices.Equal(left, []string{"bandwidth", "portmap"}) {
		t.Errorf("bin dir after uninstall: %v", left)
	}
	if left := listDir(t, s.conf); !slices.Equal(left, []string{"50-other.conflist"}) {
		t.Errorf("conf dir after uninstall: %v", left)
	}
	if _, err := os.Stat(filepath.Join(s.state, ManifestName)); err == nil {
		t.Error("manifest left behind")
	}
	u2, err := Uninstall(UninstallOptions{StateDir: s.state, RunDir: s.root + "/run"})
	if err != nil || u2.Changed() {
		t.Errorf("second uninstall: %v\n%s", err, u2)
	}
}

func TestInstallReplacesForeignFileAndUninstallRestoresIt(t *testing.T) {
	s := newSandbox(t)
	must(t, os.MkdirAll(s.bin, 0o755))
	refLoopback := filepath.Join(s.bin, "loopback")
	must(t, os.WriteFile(refLoopback, []byte("reference loopback"), 0o755))

	r := mustInstall(t, s.opts())
	if a := actions(r)[refLoopback]; a != Replaced {
		t.Fatalf("loopback: %s\n%s", a, r)
	}
	if read(t, refLoopback) != "#!binary loopback v1\n" {
		t.Fatal("loopback not replaced")
	}
	// An upgrade: a new village binary replaces ours, loopback's backup stays.
	s.writeSrc(t, "village", "#!binary village v2\n")
	s.writeSrc(t, "loopback", "#!binary loopback v2\n")
	r = mustInstall(t, s.opts())
	a := actions(r)
	if a[filepath.Join(s.bin, "village")] != Updated || a[refLoopback] != Updated || a[filepath.Join(s.bin, "village-ipam")] != Unchanged {
		t.Fatalf("upgrade:\n%s", r)
	}
	// Someone replaces village-ipam by hand after install: uninstall keeps it.
	ipam := filepath.Join(s.bin, "village-ipam")
	must(t, os.WriteFile(ipam, []byte("hand-built"), 0o755))

	u, err := Uninstall(UninstallOptions{StateDir: s.state, RunDir: s.root + "/run"})
	if err != nil {
		t.Fatal(err)
	}
	ua := actions(u)
	if ua[refLoopback] != Restored || read(t, refLoopback) != "reference loopback" {
		t.Errorf("loopback: %s, content %q", ua[refLoopback], read(t, refLoopback))
	}
	if ua[ipam] != Kept || read(t, ipam) != "hand-built" {
		t.Errorf("changed village-ipam: %s", ua[ipam])
	}
	if ua[filepath.Join(s.bin, "village")] != Removed {
		t.Errorf("village: %s", ua[filepath.Join(s.bin, "village")])
	}
	if left := listDir(t, s.bin); !slices.Equal(left, []string{"loopback", "village-ipam"}) {
		t.Errorf("bin dir: %v", left)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.state, "backup")); len(entries) != 0 {
		t.Errorf("backups left: %v", entries)
	}
}

func TestInstallTemplateVariablesAndValidation(t *testing.T) {
	s := newSandbox(t)
	o := s.opts()
	o.Template = []byte(`{"cniVersion":"1.1.0","name":"${NET:-lan}","plugins":[{"type":"village","bridge":"${BRIDGE}",
		"clusterCIDR":"${CLUSTER_CIDR}","logFile":"/var/log/village/${NODE_NAME}.log",
		"macvlan":{"master":"","hostShim":true,"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24"}]]}},
		"backend":{"type":"vxlan","vni":7,"nodes":[{"name":"${NODE_NAME}","ip":"${NODE_IP}","podCIDR":"${POD_CIDR}"}]},
		"ipam":{"type":"village-ipam","ranges":[[{"subnet":"${POD_CIDR}"}]]}}]}`)
	o.TemplateName = "test.tmpl"

	// Missing variables: an error naming them, and nothing written.
	_, err := Install(o)
	if err == nil || !strings.Contains(err.Error(), "BRIDGE, CLUSTER_CIDR, POD_CIDR") {
		t.Fatalf("missing vars: %v", err)
	}
	if _, err := os.Stat(s.bin); err == nil {
		t.Fatal("a failed render touched the bin dir")
	}
	// A value Village rejects: the error comes from netconf and names the entry.
	o.Vars = map[string]string{"BRIDGE": "this-name-is-far-too-long", "CLUSTER_CIDR": "10.244.0.0/16"}
	o.LookupEnv = func(k string) (string, bool) {
		if k == "POD_CIDR" {
			return "10.244.3.0/24", true
		}
		return "", false
	}
	if _, err := Install(o); err == nil || !strings.Contains(err.Error(), "plugins[0] (village)") || !strings.Contains(err.Error(), "bridge") {
		t.Fatalf("bad bridge: %v", err)
	}
	// A value with a quote cannot break out of its JSON string.
	o.Vars["BRIDGE"] = `vlg"x`
	mustInstall(t, o)
	var quoted struct {
		Plugins []struct{ Bridge string } `json:"plugins"`
	}
	must(t, json.Unmarshal([]byte(read(t, filepath.Join(s.conf, DefaultConfName))), &quoted))
	if quoted.Plugins[0].Bridge != `vlg"x` {
		t.Fatalf("quoted bridge rendered as %q", quoted.Plugins[0].Bridge)
	}

	o.Vars["BRIDGE"] = "vlg-lan"
	mustInstall(t, o)
	var conf struct {
		Name    string `json:"name"`
		Plugins []struct {
			LogFile string `json:"logFile"`
			Backend struct {
				Nodes []struct{ Name, IP, PodCIDR string }
			} `json:"backend"`
		} `json:"plugins"`
	}
	must(t, json.Unmarshal([]byte(read(t, filepath.Join(s.conf, DefaultConfName))), &conf))
	if conf.Name != "lan" || conf.Plugins[0].LogFile != "/var/log/village/node1.log" ||
		conf.Plugins[0].Backend.Nodes[0].IP != "192.0.2.10" || conf.Plugins[0].Backend.Nodes[0].PodCIDR != "10.244.3.0/24" {
		t.Fatalf("rendered: %+v", conf)
	}
	m, _ := LoadManifest(s.state)
	want := NetworkRecord{Name: "lan", Bridges: []string{"vlg-lan"}, VXLAN: []string{"village.7"}, Shims: []string{"vshim-eth9"}}
	if len(m.Networks) != 1 || !equalRecord(m.Networks[0], want) {
		t.Fatalf("networks %+v, want %+v", m.Networks, want)
	}
}

func equalRecord(a, b NetworkRecord) bool {
	return a.Name == b.Name && slices.Equal(a.Bridges, b.Bridges) && slices.Equal(a.VXLAN, b.VXLAN) && slices.Equal(a.Shims, b.Shims)
}

func TestInstallWarningsAndConfRename(t *testing.T) {
	s := newSandbox(t)
	must(t, os.MkdirAll(s.conf, 0o755))
	flannel := filepath.Join(s.conf, "10-flannel.conflist")
	must(t, os.WriteFile(flannel, []byte(`{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel"}]}`), 0o644))
	r := mustInstall(t, s.opts())
	joined := strings.Join(r.Warnings, "\n")
	if !strings.Contains(joined, "runtimes pick "+flannel) {
		t.Errorf("no warning about %s: %v", flannel, r.Warnings)
	}
	if !strings.Contains(joined, `plugin "portmap"`) {
		t.Errorf("no warning about the missing portmap: %v", r.Warnings)
	}
	// Installing under a name that sorts first: the old conflist goes.
	o := s.opts()
	o.ConfName = "00-village.conflist"
	r = mustInstall(t, o)
	a := actions(r)
	if a[filepath.Join(s.conf, "00-village.conflist")] != Created || a[filepath.Join(s.conf, DefaultConfName)] != Removed {
		t.Fatalf("rename:\n%s", r)
	}
	if strings.Contains(strings.Join(r.Warnings, "\n"), "runtimes pick") {
		t.Errorf("still warned: %v", r.Warnings)
	}
	if left := listDir(t, s.conf); !slices.Equal(left, []string{"00-village.conflist", "10-flannel.conflist"}) {
		t.Errorf("conf dir: %v", left)
	}
	o.ConfName = "../evil.conflist"
	if _, err := Install(o); err == nil {
		t.Error("a conflist name with a slash was accepted")
	}
}

func TestInstallMissingSourceTouchesNothing(t *testing.T) {
	s := newSandbox(t)
	must(t, os.Remove(filepath.Join(s.src, "village-ipam")))
	_, err := Install(s.opts())
	if err == nil || !strings.Contains(err.Error(), filepath.Join(s.src, "village-ipam")) {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(s.bin); err == nil {
		t.Error("bin dir created although the source was incomplete")
	}
}

func TestRender(t *testing.T) {
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"A": "x", "EMPTY": "", "Q": `a"b\c`}[k]
		return v, ok
	}
	for _, c := range []struct{ in, want, err string }{
		{`"${A}"`, `"x"`, ""},
		{`"${B:-def}"`, `"def"`, ""},
		{`"${EMPTY:-def}"`, `"def"`, ""},
		{`"${EMPTY}"`, `""`, ""},
		{`"${Q}"`, `"a\"b\\c"`, ""},
		{`$A ${A`, `$A ${A`, ""},
		{`${B} ${C} ${B}`, "", "B, C"},
	} {
		out, err := Render([]byte(c.in), lookup)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || string(out) != c.want {
			t.Errorf("%s: %q %v, want %q", c.in, out, err, c.want)
		}
	}
	if !bytes.Contains(DefaultTemplate, []byte("${POD_CIDR:-")) {
		t.Error("default template lost its POD_CIDR variable")
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func assertNoTemp(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		for _, n := range listDir(t, d) {
			if strings.Contains(n, "village-tmp") {
				t.Errorf("temporary file left: %s/%s", d, n)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The shipped conflist chains the companions (portmap, bandwidth): install
// brings the image's copy of each to a node that has none, and never
// touches the node's own.
func TestInstallCompanions(t *testing.T) {
	for _, nodeHasOne := range []bool{false, true} {
		t.Run(map[bool]string{false: "node without them", true: "node with its own"}[nodeHasOne], func(t *testing.T) {
			s := newSandbox(t)
			for _, c := range Companions {
				s.writeSrc(t, c, "#!binary "+c+" shipped\n")
				if nodeHasOne {
					must(t, os.MkdirAll(s.bin, 0o755))
					must(t, os.WriteFile(filepath.Join(s.bin, c), []byte("the node's "+c), 0o700))
				}
			}
			r := mustInstall(t, s.opts())
			for _, c := range Companions {
				path := filepath.Join(s.bin, c)
				want, wantAction := "#!binary "+c+" shipped\n", Created
				if nodeHasOne {
					want, wantAction = "the node's "+c, Unchanged
				}
				if got := read(t, path); got != want || actions(r)[path] != wantAction {
					t.Fatalf("%s after install: %q (%s), want %q (%s)\n%s", c, got, actions(r)[path], want, wantAction, r)
				}
				if fi, _ := os.Stat(path); nodeHasOne && fi.Mode().Perm() != 0o700 {
					t.Errorf("the node's %s changed mode: %v", c, fi.Mode())
				}
			}
			if len(r.Warnings) != 0 {
				t.Errorf("warnings: %v", r.Warnings)
			}
			if r2 := mustInstall(t, s.opts()); r2.Changed() {
				t.Errorf("second install changed something:\n%s", r2)
			}
			m, err := LoadManifest(s.state)
			for _, c := range Companions {
				path := filepath.Join(s.bin, c)
				if err != nil || (m.record(path) != nil) == nodeHasOne {
					t.Fatalf("manifest records %s: %v, want %v (%v)", c, m.record(path) != nil, !nodeHasOne, err)
				}
			}
			if _, err := Uninstall(UninstallOptions{StateDir: s.state, RunDir: s.root + "/run"}); err != nil {
				t.Fatal(err)
			}
			for _, c := range Companions {
				path := filepath.Join(s.bin, c)
				_, err = os.Stat(path)
				if nodeHasOne && read(t, path) != "the node's "+c {
					t.Errorf("uninstall changed the node's %s", c)
				}
				if !nodeHasOne && !os.IsNotExist(err) {
					t.Errorf("uninstall left the %s it installed: %v", c, err)
				}
			}
		})
	}
}

// TestInstallStaged: with StageDir the conflist goes to the staging
// directory, none to the config directory; the manifest lists the copy the
// agent publishes there, so uninstall removes the published copy and the
// staged one.
func TestInstallStaged(t *testing.T) {
	s := newSandbox(t)
	o := s.opts()
	o.StageDir = filepath.Join(s.state, "staged")
	r := mustInstall(t, o)
	staged, pub := filepath.Join(o.StageDir, DefaultConfName), filepath.Join(s.conf, DefaultConfName)
	if a := actions(r); a[staged] != Created {
		t.Errorf("staged conflist: %s", a[staged])
	}
	if _, err := os.Stat(pub); err == nil {
		t.Fatalf("install wrote %s although it stages", pub)
	}
	conf := read(t, staged)
	if !strings.Contains(conf, `"subnet": "10.244.1.0/24"`) {
		t.Errorf("staged conflist:\n%s", conf)
	}
	if r2 := mustInstall(t, o); r2.Changed() {
		t.Errorf("second staged install changed something:\n%s", r2)
	}
	// What the agent does once it holds the subnet.
	must(t, os.WriteFile(pub, []byte(conf), 0o644))
	u, err := Uninstall(UninstallOptions{StateDir: s.state, RunDir: s.root + "/run"})
	if err != nil {
		t.Fatal(err)
	}
	removed := map[string]bool{}
	for _, c := range u.Changes {
		if c.Action == Removed {
			removed[c.Path] = true
		}
	}
	if !removed[pub] || !removed[staged] {
		t.Errorf("uninstall removed %v, want %s and %s", removed, pub, staged)
	}
	if left := listDir(t, s.conf); len(left) != 0 {
		t.Errorf("conf dir after uninstall: %v", left)
	}
}
