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

// Release is a released version of Village built from its git tag: the
// tree at the tag (its deploy/ is what a user of that release applied),
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

// LastRelease finds the newest v* tag that is an ancestor of the module's
// HEAD (of HEAD's parent when HEAD itself is tagged: the release an
// upgrade starts from is never the checkout) and builds it once into
// /var/cache/village/release-<tag>-<commit> (git archive of the tag, then
// its build_linux.sh with VERSION=<tag> and its mkimage). A missing tag
// fails the test with how to get it.
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
	from := "HEAD"
	tag, err := git("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", from)
	if err == nil {
		var c, head string
		if c, err = git("rev-list", "-n1", tag); err == nil {
			if head, err = git("rev-parse", "HEAD"); err == nil && c == head {
				from = "HEAD^"
				tag, err = git("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", from)
			}
		}
	}
	if err != nil {
		t.Fatalf("kubecluster: no release tag (v*) is an ancestor of %s in %s: %v\n"+
			"The upgrade test installs the newest release first. Fetch the tags (git fetch --tags origin; "+
			"a shallow clone needs git fetch --unshallow) or create the first one: git tag v0.1.0 1ab6f40", from, root, err)
	}
	commit, err := git("rev-list", "-n1", tag)
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
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
