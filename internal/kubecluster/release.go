package kubecluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// Release is a released version of Village built from its commit: the
// tree at the release (its deploy/ is what a user of that release applied),
// its binaries and its DaemonSet image, built by that tree's own
// build_linux.sh and mkimage.
type Release struct {
	Tag    string // e.g. v0.1.0
	Commit string // the commit the tag names
	Dir    string // the tree at the tag, with bin/ and village-image.tar
	Image  string // the image reference the tree's DaemonSet runs
}

// Archive is the release's DaemonSet image (an OCI archive).
func (r *Release) Archive() string { return filepath.Join(r.Dir, "village-image.tar") }

// LastRelease finds the newest release in the module's RELEASES file
// whose commit is an ancestor of HEAD and is not HEAD itself (the release
// an upgrade starts from is never the checkout) and builds it once into
// /var/cache/village/release-<tag>-<commit> (git archive of the commit,
// then its build_linux.sh with VERSION=<tag> and its mkimage). A git tag of
// the same name that names another commit fails the test: the list and the
// tags must agree.
func LastRelease(t testing.TB) *Release {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return strings.TrimSpace(string(out)), err
	}
	list, err := os.ReadFile(filepath.Join(root, "RELEASES"))
	if err != nil {
		t.Fatalf("kubecluster: the release list: %v", err)
	}
	releases, err := parseReleases(string(list))
	if err != nil {
		t.Fatalf("kubecluster: %s: %v", filepath.Join(root, "RELEASES"), err)
	}
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	var tag, commit string
	for i := len(releases) - 1; i >= 0 && tag == ""; i-- {
		c := releases[i][1]
		if c == head {
			continue
		}
		if _, err := git("merge-base", "--is-ancestor", c, head); err == nil {
			tag, commit = releases[i][0], c
		}
	}
	if tag == "" {
		t.Fatalf("kubecluster: no release in RELEASES is an ancestor of HEAD (%s) in %s; "+
			"a shallow clone needs git fetch --unshallow", head, root)
	}
	if c, err := git("rev-list", "-n1", "refs/tags/"+tag); err == nil && c != commit {
		t.Fatalf("kubecluster: tag %s names %s but RELEASES says %s", tag, c, commit)
	}
	r := &Release{Tag: tag, Commit: commit, Dir: filepath.Join("/var/cache/village", "release-"+tag+"-"+commit)}
	if _, err := os.Stat(r.Archive()); err != nil {
		if err := buildRelease(root, r); err != nil {
			t.Fatalf("kubecluster: building release %s (%s): %v", tag, commit, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(r.Dir, "deploy", "kubernetes", "daemonset.yaml"))
	if err != nil {
		t.Fatalf("kubecluster: release %s: %v", tag, err)
	}
	m := regexp.MustCompile(`(?m)^\s*image:\s*(\S+)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("kubecluster: release %s: no image in deploy/kubernetes/daemonset.yaml", tag)
	}
	r.Image = string(m[1])
	return r
}

// buildRelease unpacks the tag's tree into a directory beside r.Dir,
// builds it there and renames it to r.Dir, so a half-built tree is never
// taken for a built one.
func buildRelease(root string, r *Release) error {
	if err := os.MkdirAll(filepath.Dir(r.Dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(r.Dir), filepath.Base(r.Dir)+".building-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	steps := []struct {
		dir  string
		env  []string
		name string
		args []string
	}{
		{root, nil, "sh", []string{"-c", "git archive " + r.Commit + " | tar -x -C " + tmp}},
		{tmp, []string{"VERSION=" + r.Tag}, "./build_linux.sh", nil},
		{tmp, []string{"CGO_ENABLED=0"}, "go", []string{"run", "-trimpath", "./internal/ociimage/mkimage", "-bin", "bin", "-ref", "bin/ref", "-o", "village-image.tar"}},
	}
	for _, s := range steps {
		cmd := exec.Command(s.name, s.args...)
		cmd.Dir = s.dir
		cmd.Env = append(os.Environ(), s.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s in %s: %w\n%s", s.name, strings.Join(s.args, " "), s.dir, err, out)
		}
	}
	return os.Rename(tmp, r.Dir)
}

// commitID is a full git commit id, as RELEASES names them.
var commitID = regexp.MustCompile(`^[0-9a-f]{40}$`)

// parseReleases reads RELEASES: "<tag> <commit>" lines, oldest first;
// blank lines and # comments are skipped.
func parseReleases(s string) ([][2]string, error) {
	var out [][2]string
	for n, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[0], "v") || !commitID.MatchString(f[1]) {
			return nil, fmt.Errorf("line %d: %q is not \"<v-tag> <40-hex commit>\"", n+1, line)
		}
		out = append(out, [2]string{f[0], f[1]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no release listed")
	}
	return out, nil
}
