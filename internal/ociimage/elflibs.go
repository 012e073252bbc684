package ociimage

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// multiarch is Debian's library directory name for an ELF machine.
var multiarch = map[elf.Machine]string{
	elf.EM_X86_64:  "x86_64-linux-gnu",
	elf.EM_AARCH64: "aarch64-linux-gnu",
	elf.EM_ARM:     "arm-linux-gnueabihf",
}

// inRoot resolves p (absolute, inside root) through symlinks the way the
// image's loader will, absolute targets relative to root; it returns the
// host path of the file.
func inRoot(root, p string) (string, error) {
	for range 40 {
		host := filepath.Join(root, p)
		st, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if st.Mode()&os.ModeSymlink == 0 {
			return host, nil
		}
		t, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		p = filepath.Clean(t)
	}
	return "", fmt.Errorf("%s: too many symlinks", p)
}

// ELFLibs lists the loader and the shared libraries the ELF files (host
// paths) need, transitively, as paths inside root, found the way the glibc
// loader of a Debian system finds them (its multiarch directories, then /lib
// and /usr/lib). It reads the ELF headers only, so it works for any
// architecture: the image's per-platform iptables come from unpacked .debs.
func ELFLibs(root string, elfs []string) ([]string, error) {
	found := map[string]bool{}
	queue := append([]string(nil), elfs...)
	for len(queue) > 0 {
		host := queue[0]
		queue = queue[1:]
		f, err := elf.Open(host)
		if err != nil {
			return nil, fmt.Errorf("read ELF %s: %w", host, err)
		}
		needed, err := f.DynString(elf.DT_NEEDED)
		interp := ""
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err == nil {
					interp = strings.TrimRight(string(b), "\x00")
				}
			}
		}
		machine := f.Machine
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("DT_NEEDED of %s: %w", host, err)
		}
		var want []string
		if interp != "" {
			want = append(want, interp)
		}
		dirs := []string{"/lib/" + multiarch[machine], "/usr/lib/" + multiarch[machine], "/lib", "/usr/lib"}
		for _, n := range needed {
			ok := false
			for _, d := range dirs {
				p := filepath.Join(d, n)
				if _, err := inRoot(root, p); err == nil {
					want, ok = append(want, p), true
					break
				}
			}
			if !ok {
				return nil, fmt.Errorf("%s needs %s: not in %s under %s", host, n, strings.Join(dirs, " "), root)
			}
		}
		for _, p := range want {
			if found[p] {
				continue
			}
			found[p] = true
			h, err := inRoot(root, p)
			if err != nil {
				return nil, fmt.Errorf("%s needs %s: %w", host, p, err)
			}
			queue = append(queue, h)
		}
	}
	libs := make([]string, 0, len(found))
	for l := range found {
		libs = append(libs, l)
	}
	sort.Strings(libs)
	return libs, nil
}
