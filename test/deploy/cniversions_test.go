package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/install"
)

// TestShippedCNIVersionsAgree: every shipped conflist (conf/, the built-in
// install template, the ConfigMap's template) says cniVersion 1.0.0, which
// libcni 1.1.x runtimes (containerd 1.6/1.7) read, and the same cniVersions
// list, from which the current libcni picks 1.1.0 (STATUS, GC).
func TestShippedCNIVersionsAgree(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	srcs := map[string][]byte{"built-in install template": install.DefaultTemplate}
	for _, cm := range load(t).configMaps {
		for k, v := range cm.Data {
			srcs["ConfigMap "+cm.Name+" key "+k] = []byte(v)
		}
	}
	files, err := filepath.Glob(filepath.Join(root, "conf", "*.conflist"))
	if err != nil || len(files) < 5 {
		t.Fatalf("conf/*.conflist: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		srcs["conf/"+filepath.Base(f)] = b
	}
	vars := map[string]string{"NODE_NAME": "node1", "NODE_IP": "192.0.2.10", "DEFAULT_IFACE": "eth0"}
	want := []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	for name, tmpl := range srcs {
		out, err := install.Render(tmpl, func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var v struct {
			CNIVersion  string   `json:"cniVersion"`
			CNIVersions []string `json:"cniVersions"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if v.CNIVersion != "1.0.0" || !slices.Equal(v.CNIVersions, want) {
			t.Errorf("%s: cniVersion %q cniVersions %v, want 1.0.0 and %v", name, v.CNIVersion, v.CNIVersions, want)
		}
		if list, err := libcni.ConfListFromBytes(out); err != nil || list.CNIVersion != "1.1.0" {
			t.Errorf("%s: current libcni reads %v (%v), want version 1.1.0", name, list, err)
		}
	}
}
