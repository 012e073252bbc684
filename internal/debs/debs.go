// Package debs fetches Debian packages of any architecture with apt-get
// download and unpacks them with dpkg-deb -x, no emulation, caching both
// under /var/cache/village/debs keyed by package, version and architecture:
// the image's per-platform iptables (internal/ociimage) and the arm VM's
// kernel, busybox and tools (test/armvm) come from here.
package debs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// CacheDir holds the downloaded .debs and the unpacked roots
// ($VILLAGE_DEB_CACHE overrides it).
func CacheDir() string {
	if d := os.Getenv("VILLAGE_DEB_CACHE"); d != "" {
		return d
	}
	return "/var/cache/village/debs"
}

// Arch is the Debian architecture of a Go GOARCH (and GOARM 7 for arm).
func Arch(goarch string) (string, error) {
	switch goarch {
	case "amd64", "arm64":
		return goarch, nil
	case "arm":
		return "armhf", nil
	}
	return "", fmt.Errorf("no Debian architecture for GOARCH %q", goarch)
}

var updateMu sync.Mutex

// candidates maps each "name:arch" to the version apt would install, "" when
// apt knows none; one apt-cache call for all (apt is slow to start).
func candidates(pkgs []string) (map[string]string, error) {
	out, err := exec.Command("apt-cache", append([]string{"policy"}, pkgs...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache policy %s: %w", strings.Join(pkgs, " "), err)
	}
	vs := map[string]string{}
	cur := ""
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, " ") && strings.HasSuffix(l, ":") {
			cur = strings.TrimSuffix(l, ":")
			continue
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Candidate:"); ok && cur != "" {
			if v = strings.TrimSpace(v); v != "(none)" {
				vs[cur] = v
			}
		}
	}
	// apt names packages of the machine's own architecture without it.
	if native, err := exec.Command("dpkg", "--print-architecture").Output(); err == nil {
		for _, p := range pkgs {
			if name, ok := strings.CutSuffix(p, ":"+strings.TrimSpace(string(native))); ok && vs[p] == "" {
				vs[p] = vs[name]
			}
		}
	}
	return vs, nil
}

// versions returns apt's candidate version of each "name:arch", adding the
// architectures to dpkg and updating apt's lists once when apt lacks one.
func versions(pkgs []string) (map[string]string, error) {
	missing := func(vs map[string]string) []string {
		var m []string
		for _, p := range pkgs {
			if vs[p] == "" {
				m = append(m, p)
			}
		}
		return m
	}
	vs, err := candidates(pkgs)
	if err != nil || len(missing(vs)) == 0 {
		return vs, err
	}
	updateMu.Lock()
	defer updateMu.Unlock()
	for _, p := range missing(vs) {
		arch := p[strings.LastIndexByte(p, ':')+1:]
		if arch == "all" {
			continue
		}
		if out, err := exec.Command("dpkg", "--add-architecture", arch).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("dpkg --add-architecture %s: %w: %s", arch, err, out)
		}
	}
	updateErr := update()
	if vs, err = candidates(pkgs); err == nil && len(missing(vs)) > 0 {
		err = fmt.Errorf("apt knows no package %s", strings.Join(missing(vs), " "))
		if updateErr != nil {
			err = fmt.Errorf("%w (%w)", err, updateErr)
		}
	}
	return vs, err
}

// updateTries and updatePause bound update's retries: a Debian mirror in the
// middle of a sync serves an index whose size does not match its Release
// file for a few minutes, and apt-get update then fails for that one index.
var (
	updateTries = 4
	updatePause = 30 * time.Second
)

// update runs apt-get update until it succeeds or updateTries have failed,
// pausing between tries. Its error alone does not fail the caller: apt keeps
// the indexes it did fetch (and the old ones of those it did not), so the
// caller asks apt for its candidates anyway and fails only on a package apt
// still does not know, naming the update's error with it.
func update() error {
	var err error
	for try := 1; try <= updateTries; try++ {
		out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput()
		if uerr == nil {
			return nil
		}
		err = fmt.Errorf("apt-get update (try %d of %d): %w: %s", try, updateTries, uerr, out)
		if try < updateTries {
			time.Sleep(updatePause)
		}
	}
	return err
}

// Fetch returns the cached .debs of the packages ("name" of arch, or
// "name:otherarch") at apt's candidate versions, downloading the ones the
// cache lacks in one apt-get download.
func Fetch(arch string, names ...string) ([]string, error) {
	pkgs := make([]string, len(names))
	for i, n := range names {
		if !strings.Contains(n, ":") {
			n += ":" + arch
		}
		pkgs[i] = n
	}
	vs, err := versions(pkgs)
	if err != nil {
		return nil, err
	}
	dir := mkdir(CacheDir())
	files := make([]string, len(pkgs))
	var get []string
	for i, p := range pkgs {
		name, a, _ := strings.Cut(p, ":")
		files[i] = filepath.Join(dir, fmt.Sprintf("%s_%s_%s.deb", name, strings.ReplaceAll(vs[p], ":", "%3a"), a))
		if _, err := os.Stat(files[i]); err != nil {
			get = append(get, p+"="+vs[p])
		}
	}
	if len(get) == 0 {
		return files, nil
	}
	tmp, err := os.MkdirTemp(dir, ".dl-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("apt-get", append([]string{"download", "-qq"}, get...)...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get download %s: %w: %s", strings.Join(get, " "), err, out)
	}
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			continue
		}
		// apt names the file name_version_arch.deb, the epoch's colon as %3a.
		if err := os.Rename(filepath.Join(tmp, filepath.Base(f)), f); err != nil {
			return nil, fmt.Errorf("apt-get download gave no %s: %w", filepath.Base(f), err)
		}
	}
	return files, nil
}

func mkdir(d string) string {
	_ = os.MkdirAll(d, 0o755)
	return d
}

// Root returns a directory holding the named packages of arch unpacked
// together (dpkg-deb -x), made once per set of versions and kept in the
// cache. Package names may carry their own architecture (name:all).
func Root(arch string, names ...string) (string, error) {
	files, err := Fetch(arch, names...)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(strings.Join(files, "\n")))
	root := filepath.Join(CacheDir(), "roots", arch+"-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(root); err == nil {
		return root, nil
	}
	tmp, err := os.MkdirTemp(mkdir(filepath.Dir(root)), ".unpack-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, f := range files {
		if out, err := exec.Command("dpkg-deb", "-x", f, tmp).CombinedOutput(); err != nil {
			return "", fmt.Errorf("dpkg-deb -x %s: %w: %s", f, err, out)
		}
	}
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(root); serr == nil { // made meanwhile by another process
			return root, nil
		}
		return "", err
	}
	return root, nil
}
