package deps

import (
	"bufio"
	"debug/elf"
	"debug/gosym"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

const module = "github.com/village-cni/village/"

// listed is what `go list -json` says of one package of the module.
type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// goList runs `go list -json` on the module's packages (non-test code only).
func goList(t *testing.T, root string) []listed {
	t.Helper()
	pkgs := goListArgs(t, root, "-json=ImportPath,Imports,Deps", "./...")
	for i := range pkgs {
		pkgs[i].ImportPath = strings.TrimPrefix(pkgs[i].ImportPath, module)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list listed only %d packages", len(pkgs))
	}
	return pkgs
}

// goListArgs runs `go list` with args (which ask for JSON) in root and
// decodes the packages it lists.
func goListArgs(t *testing.T, root string, args ...string) []listed {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// ours returns the module's packages among paths, without the module prefix.
func ours(paths []string) []string {
	var out []string
	for _, p := range paths {
		if rest, ok := strings.CutPrefix(p, module); ok {
			out = append(out, rest)
		}
	}
	return out
}

var mapRow = regexp.MustCompile("^\\| `([^`]+)` \\|[^|]*\\|([^|]*)\\|$")
var backticked = regexp.MustCompile("`([^`]+)`")

// packageMap reads the "may import" column of docs/architecture.md.
func packageMap(t *testing.T, root string) map[string][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		row := mapRow.FindStringSubmatch(sc.Text())
		if row == nil {
			continue
		}
		allowed := []string{}
		for _, a := range backticked.FindAllStringSubmatch(row[2], -1) {
			allowed = append(allowed, a[1])
		}
		m[row[1]] = allowed
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(m) < 20 {
		t.Fatalf("docs/architecture.md: read only %d rows of the package map", len(m))
	}
	return m
}

// TestPackageMap keeps docs/architecture.md's package map true: every
// package of the module has a row, imports only what its row allows, and
// nothing under pkg/ depends on a main, a test or a test helper.
func TestPackageMap(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	m := packageMap(t, root)
	pkgs := goList(t, root)
	seen := map[string]bool{}
	for _, p := range pkgs {
		seen[p.ImportPath] = true
		allowed, ok := m[p.ImportPath]
		if !ok {
			t.Errorf("%s has no row in the package map of docs/architecture.md", p.ImportPath)
			continue
		}
		for _, imp := range ours(p.Imports) {
			if !slices.Contains(allowed, imp) {
				t.Errorf("%s imports %s, which the package map of docs/architecture.md does not allow", p.ImportPath, imp)
			}
		}
		if strings.HasPrefix(p.ImportPath, "pkg/") {
			for _, d := range ours(p.Deps) {
				if !strings.HasPrefix(d, "pkg/") {
					t.Errorf("%s depends on %s: nothing under pkg/ may depend on mains, tests or test helpers", p.ImportPath, d)
				}
			}
		}
	}
	for name := range m {
		if !seen[name] {
			t.Errorf("the package map of docs/architecture.md names %s, which go list does not know", name)
		}
	}
}

// TestVillagedDoesNotLinkPluginVerbs states the rule for the villaged
// binary, all its packages at once (`go list -deps ./cmd/villaged`): it
// shares types with the plugins through netconf and overlay, and links none
// of the plugins' verb packages nor the CNI skeleton. It does link libcni,
// on purpose: `villaged install` parses the rendered conflist and lists the
// config directory with the parser a runtime uses (libcni.ConfListFromBytes,
// libcni.ConfFiles), so it refuses what runtimes would refuse. libcni brings
// cni/pkg/invoke along; nothing else in the binary may import invoke (no
// plugin is exec'd by villaged), and among Village's packages only
// pkg/install imports libcni.
func TestVillagedDoesNotLinkPluginVerbs(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	const (
		libcni = "github.com/containernetworking/cni/libcni"
		invoke = "github.com/containernetworking/cni/pkg/invoke"
	)
	forbidden := []string{module + "pkg/village", module + "pkg/ipam/plugin", module + "pkg/loopback",
		module + "pkg/cnilog", "github.com/containernetworking/cni/pkg/skel"}
	deps := goListArgs(t, root, "-deps", "-json=ImportPath,Imports", "./cmd/villaged")
	seen := map[string]bool{}
	for _, p := range deps {
		seen[p.ImportPath] = true
		if slices.Contains(forbidden, p.ImportPath) {
			t.Errorf("cmd/villaged links %s", p.ImportPath)
		}
		if slices.Contains(p.Imports, invoke) && p.ImportPath != libcni {
			t.Errorf("%s imports %s: villaged execs no plugin (only libcni may bring it)", p.ImportPath, invoke)
		}
		if rest, ok := strings.CutPrefix(p.ImportPath, module); ok && slices.Contains(p.Imports, libcni) && rest != "pkg/install" {
			t.Errorf("%s imports libcni: in villaged only pkg/install parses conflists", rest)
		}
	}
	// Prove the listing is the binary's: its main, the agent, and the
	// libcni path this rule allows.
	for _, want := range []string{module + "cmd/villaged", module + "pkg/agent", module + "pkg/install", libcni} {
		if !seen[want] {
			t.Errorf("go list -deps ./cmd/villaged does not list %s (of %d packages)", want, len(deps))
		}
	}
}

// TestBinariesLinkOnlyTheirStore states what the heavy clients cost and
// who may pay: of Village's binaries only villaged and village-ipam-etcd
// link the etcd client (and gRPC); village-ipam-kube, exec'd for every pod
// of a network on the kubernetes store, links the Kubernetes client and not
// the etcd one. With the binaries' build tags (testenv.BuildTags) none of
// them links html/template or golang.org/x/net/trace: their reflective
// method lookups would keep every exported method of every linked type. The
// binaries build_linux.sh made (VILLAGE_BIN_DIR, or the test's own build)
// must carry those tags.
func TestBinariesLinkOnlyTheirStore(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	const etcd = "go.etcd.io/etcd/client/v3"
	cases := []struct {
		pkg      string
		wantEtcd bool
		want     string // a package the listing must hold, so it is the binary's
	}{
		{"./cmd/villaged", true, module + "pkg/agent"},
		{"./plugins/ipam/village-ipam-etcd", true, module + "pkg/ipam/store/etcd"},
		{"./plugins/ipam/village-ipam-kube", false, module + "pkg/ipam/store/kube"},
		{"./plugins/ipam/village-ipam", false, module + "pkg/ipam/plugin"},
	}
	for _, c := range cases {
		deps := goListArgs(t, root, "-tags", testenv.BuildTags, "-deps", "-json=ImportPath,Imports", c.pkg)
		seen := map[string]bool{}
		for _, p := range deps {
			seen[p.ImportPath] = true
		}
		if seen[etcd] != c.wantEtcd {
			t.Errorf("%s: links %s = %v, want %v", c.pkg, etcd, seen[etcd], c.wantEtcd)
		}
		for _, bad := range []string{"html/template", "text/template", "golang.org/x/net/trace"} {
			if seen[bad] && !(bad != "golang.org/x/net/trace" && viaMsgpackRPC[c.pkg] && onlyImportedBy(deps, bad, allowTemplate)) {
				t.Errorf("%s links %s with -tags %s", c.pkg, bad, testenv.BuildTags)
			}
		}
		if !seen[c.want] {
			t.Errorf("go list -deps %s does not list %s (of %d packages)", c.pkg, c.want, len(deps))
		}
	}
	out, err := exec.Command("go", "version", "-m", filepath.Join(testenv.Bins(t), "villaged")).Output()
	if err != nil {
		t.Fatalf("go version -m villaged: %v", err)
	}
	if !strings.Contains(string(out), "-tags="+testenv.BuildTags) {
		t.Errorf("the built villaged was not built with -tags %s:\n%s", testenv.BuildTags, out)
	}
	// The template packages villaged links (below) must stay inert: no
	// template is ever executed, so the executor's reflective method
	// lookups are not in the binary.
	if linksFunc(t, filepath.Join(testenv.Bins(t), "villaged"), "text/template.(*state).evalField") {
		t.Error("villaged links text/template's executor (reflective method lookups keep every exported method)")
	}
}

// linksFunc says whether the binary at path has function name, read from
// its pclntab (which a stripped binary keeps).
func linksFunc(t *testing.T, path, name string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pcl, text := f.Section(".gopclntab"), f.Section(".text")
	if pcl == nil || text == nil {
		t.Fatalf("%s: no .gopclntab or .text section", path)
	}
	data, err := pcl.Data()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if tab.LookupFunc("main.main") == nil {
		t.Fatalf("%s: the function table lists no main.main", path)
	}
	return tab.LookupFunc(name) != nil
}

// viaMsgpackRPC: villaged links hashicorp/memberlist (the LAN Services'
// gossip, pkg/lansvc/members), whose codec github.com/hashicorp/go-msgpack
// imports text/template and net/rpc unconditionally, which imports
// html/template for its debug page. No template is executed (checked on the built binary above),
// so the reflective lookups the rule is about are not linked.
var viaMsgpackRPC = map[string]bool{"./cmd/villaged": true}

// allowTemplate are the packages allowed to bring the template packages.
var allowTemplate = []string{"net/rpc", "html/template", "text/template", "github.com/hashicorp/go-msgpack/v2/codec"}

// onlyImportedBy says whether every package of deps importing pkg is in
// allowed.
func onlyImportedBy(deps []listed, pkg string, allowed []string) bool {
	for _, p := range deps {
		if slices.Contains(p.Imports, pkg) && !slices.Contains(allowed, p.ImportPath) && !strings.HasPrefix(p.ImportPath, pkg+"/") {
			return false
		}
	}
	return true
}

// TestPluginDoesNotLinkKubernetes states the reverse rule for the village
// plugin binary (`go list -deps ./plugins/main/village`): it learns what it
// needs about a Kubernetes pod from the node's agent over pkg/agentsock and
// links no Kubernetes client, API types or apimachinery (a per-pod exec
// pays for every package it links).
func TestPluginDoesNotLinkKubernetes(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	deps := goListArgs(t, root, "-deps", "-json=ImportPath,Imports", "./plugins/main/village")
	seen := map[string]bool{}
	for _, p := range deps {
		seen[p.ImportPath] = true
		// Nor wireguard-go (its device, TUN and sockets) or the
		// agent's pkg/wireguard/userspace: the plugin only reads a
		// WireGuard device, through wgctrl.
		for _, bad := range []string{"k8s.io/", "sigs.k8s.io/", "golang.zx2c4.com/wireguard/device", "golang.zx2c4.com/wireguard/tun", module + "pkg/wireguard/userspace"} {
			if strings.HasPrefix(p.ImportPath, bad) {
				t.Errorf("plugins/main/village links %s", p.ImportPath)
			}
		}
	}
	for _, want := range []string{module + "plugins/main/village", module + "pkg/village", module + "pkg/agentsock"} {
		if !seen[want] {
			t.Errorf("go list -deps ./plugins/main/village does not list %s (of %d packages)", want, len(deps))
		}
	}
}

// TestNodeLocalIsStandardLibraryOnly keeps pkg/nodelocal a leaf every
// binary may link: it imports the standard library alone (a package path
// without a dot in its first element).
func TestNodeLocalIsStandardLibraryOnly(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	deps := goListArgs(t, root, "-deps", "-json=ImportPath", "./pkg/nodelocal")
	for _, p := range deps {
		if p.ImportPath == module+"pkg/nodelocal" {
			continue
		}
		if first, _, _ := strings.Cut(p.ImportPath, "/"); strings.Contains(first, ".") {
			t.Errorf("pkg/nodelocal links %s; it must stay standard library only", p.ImportPath)
		}
	}
	if len(deps) < 2 {
		t.Fatalf("go list -deps ./pkg/nodelocal listed %d packages", len(deps))
	}
}
