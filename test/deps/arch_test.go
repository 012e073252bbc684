package deps

import (
	"bufio"
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
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -json ./...: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		p.ImportPath = strings.TrimPrefix(p.ImportPath, module)
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list listed only %d packages", len(pkgs))
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

// TestAgentDoesNotLinkPluginVerbs: villaged shares types with the plugin
// through netconf and overlay, never through the plugin's verb package or
// the CNI skeleton.
func TestAgentDoesNotLinkPluginVerbs(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{module + "pkg/village", "github.com/containernetworking/cni/pkg/skel", "github.com/containernetworking/cni/pkg/invoke"}
	for _, p := range goList(t, root) {
		if p.ImportPath != "pkg/agent" {
			continue
		}
		if len(p.Deps) < 10 {
			t.Fatalf("pkg/agent lists only %v", p.Deps)
		}
		for _, d := range p.Deps {
			if slices.Contains(forbidden, d) {
				t.Errorf("pkg/agent links %s", d)
			}
		}
		return
	}
	t.Fatal("go list did not list pkg/agent")
}
