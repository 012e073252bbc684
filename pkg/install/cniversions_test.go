package install

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// versionsOf returns a conflist's "cniVersion" and "cniVersions" as written.
func versionsOf(t *testing.T, b []byte) (string, []string) {
	t.Helper()
	var v struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v.CNIVersion, v.CNIVersions
}

// TestInstallWritesCNIVersions: the built-in template lists the versions a
// runtime may pick (cniVersions, CNI 1.1) next to a cniVersion that libcni
// 1.1.x runtimes read; the installed conflist carries both unchanged, the
// current libcni picks 1.1.0 from it, and install has nothing to warn about.
func TestInstallWritesCNIVersions(t *testing.T) {
	s := newSandbox(t)
	// The template chains the reference companions, which this install's
	// source does not hold: the node has them.
	if err := os.MkdirAll(s.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range Companions {
		if err := os.WriteFile(filepath.Join(s.bin, c), []byte("#!binary "+c+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := mustInstall(t, s.opts())
	if len(r.Warnings) != 0 {
		t.Fatalf("warnings for the built-in template: %v", r.Warnings)
	}
	b, err := os.ReadFile(filepath.Join(s.conf, "10-village.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	tv, tvs := versionsOf(t, DefaultTemplate)
	v, vs := versionsOf(t, b)
	if tv != "1.0.0" || !slices.Contains(tvs, "1.1.0") || v != tv || !slices.Equal(vs, tvs) {
		t.Fatalf("installed cniVersion %q cniVersions %v; template %q %v", v, vs, tv, tvs)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil || list.CNIVersion != "1.1.0" {
		t.Fatalf("current libcni reads the installed conflist as %v (%v), want 1.1.0", list, err)
	}

	// A template that lists versions only a future libcni knows is still
	// written (the runtime decides), and a template without cniVersions is
	// written without one.
	for _, c := range []struct{ name, versions, want string }{
		{"only 1.0.0", `"cniVersion": "1.0.0",`, "1.0.0"},
		{"listed", `"cniVersion": "1.0.0", "cniVersions": ["1.0.0", "1.1.0"],`, "1.1.0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			o := s.opts()
			o.Template = []byte(`{` + c.versions + ` "name": "v", "plugins": [{"type": "village", "ipam": {"type": "village-ipam", "subnet": "10.9.0.0/24"}}]}`)
			if r := mustInstall(t, o); len(r.Warnings) != 0 {
				t.Fatalf("warnings: %v", r.Warnings)
			}
			b, err := os.ReadFile(filepath.Join(s.conf, "10-village.conflist"))
			if err != nil {
				t.Fatal(err)
			}
			if list, err := libcni.ConfListFromBytes(b); err != nil || list.CNIVersion != c.want {
				t.Fatalf("installed %s read as %+v (%v), want %s", b, list, err, c.want)
			}
			if strings.Contains(c.versions, "cniVersions") != strings.Contains(string(b), "cniVersions") {
				t.Fatalf("installed %s from template %s", b, o.Template)
			}
		})
	}
}
