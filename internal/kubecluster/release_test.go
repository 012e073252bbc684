package kubecluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

func TestParseReleases(t *testing.T) {
	const c1, c2 = "1ab6f40e6a9135603642bf95dc45a90a0ac796fe", "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name, in string
		want     int
		bad      bool
	}{
		{"one", "v0.1.0 " + c1 + "\n", 1, false},
		{"comments and blanks", "# list\n\nv0.1.0 " + c1 + "\n  v0.2.0  " + c2 + "  \n", 2, false},
		{"empty", "# nothing yet\n", 0, true},
		{"short commit", "v0.1.0 1ab6f40\n", 0, true},
		{"no v", "0.1.0 " + c1 + "\n", 0, true},
		{"three fields", "v0.1.0 " + c1 + " extra\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseReleases(tc.in)
			if tc.bad != (err != nil) || len(got) != tc.want {
				t.Fatalf("parseReleases(%q) = %v, %v", tc.in, got, err)
			}
		})
	}
}

// TestReleasesFile: the committed list parses, and each commit is in this
// clone's history (a release the upgrade test could not build is caught
// here, without a cluster).
func TestReleasesFile(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "RELEASES"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := parseReleases(string(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if out, err := exec.Command("git", "-C", root, "cat-file", "-e", r[1]+"^{commit}").CombinedOutput(); err != nil {
			t.Errorf("release %s: commit %s not in this clone: %v %s", r[0], r[1], err, out)
		}
	}
}
