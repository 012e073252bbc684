package ociimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/village-cni/village/pkg/install"
)

// VillageBinaries are the static binaries of the DaemonSet image, all in
// BinDir: villaged and the plugins `villaged install` copies from the
// directory of the villaged that runs it.
var VillageBinaries = append([]string{"villaged"}, install.Plugins...)

// BinDir is where the image keeps Village's binaries.
const BinDir = "/usr/local/bin"

// XtablesWrapper is the binary (cmd/village-xtables) the image's plain
// iptables names point at: it runs the nft or the legacy variant, whichever
// the node uses, judged per call the way the agent picks its masquerade
// backend. It is built with the other binaries.
const XtablesWrapper = "village-xtables"

// iptablesTools are the commands the agent execs (go-iptables in pkg/masq's
// iptables backend and pkg/agent's orphan check; Detect looks iptables up)
// with the binary each names: the plain names go through XtablesWrapper, the
// -nft and -legacy names straight to their multi-call binary.
var iptablesTools = map[string]string{
	"iptables": XtablesWrapper, "ip6tables": XtablesWrapper,
	"iptables-save": XtablesWrapper, "ip6tables-save": XtablesWrapper,
	"iptables-restore": XtablesWrapper, "ip6tables-restore": XtablesWrapper,
	"iptables-nft": "xtables-nft-multi", "ip6tables-nft": "xtables-nft-multi",
	"iptables-nft-save": "xtables-nft-multi", "ip6tables-nft-save": "xtables-nft-multi",
	"iptables-legacy": "xtables-legacy-multi", "ip6tables-legacy": "xtables-legacy-multi",
	"iptables-legacy-save": "xtables-legacy-multi", "ip6tables-legacy-save": "xtables-legacy-multi",
}

// VillageOptions says where the parts of the DaemonSet image come from.
type VillageOptions struct {
	Name   string // image reference, normally buildinfo.Image
	BinDir string // directory holding VillageBinaries (./bin after build_linux.sh)
	RefDir string // directory holding install.Companions (./bin/ref after build_linux.sh); BinDir/ref when empty
	// Root is the file system the image's iptables comes from: "" or "/"
	// for this machine's, or a directory of Debian packages of the image's
	// platform unpacked (IptablesRoot).
	Root     string
	Platform Platform // the image's platform; zero: this machine's
}

// IptablesPackages are the Debian packages (of the image's architecture)
// that hold the image's iptables: the multi-call binaries, their
// extensions and every library they link.
var IptablesPackages = []string{
	"iptables", "libxtables12", "libip4tc2", "libip6tc2", "libnftnl11", "libmnl0",
	"libnetfilter-conntrack3", "libnfnetlink0", "libc6",
}

// Village returns the DaemonSet image: Village's static binaries in BinDir
// plus the host's iptables (nft and legacy multi-call binaries, the shared
// libraries they and their extensions link, the extensions themselves) behind
// XtablesWrapper, because villaged execs iptables/ip6tables on nodes that use
// the iptables backend. Nothing else: no shell, no package manager.
func Village(o VillageOptions) (Image, error) {
	img := Image{Name: o.Name, Entrypoint: nil, Cmd: []string{"villaged", "version"}, Platform: o.Platform}
	for _, b := range VillageBinaries {
		f, err := HostFile(filepath.Join(o.BinDir, b), filepath.Join(BinDir, b))
		if err != nil {
			return Image{}, err
		}
		img.Files = append(img.Files, f)
	}
	// The reference plugins the shipped conflist chains (portmap, bandwidth), beside
	// villaged: `villaged install` brings them to nodes that lack them.
	if o.RefDir == "" {
		o.RefDir = filepath.Join(o.BinDir, "ref")
	}
	for _, b := range install.Companions {
		f, err := HostFile(filepath.Join(o.RefDir, b), filepath.Join(BinDir, b))
		if err != nil {
			return Image{}, fmt.Errorf("the image carries the reference %s the conflist chains (./build_linux.sh builds it into bin/ref): %w", b, err)
		}
		img.Files = append(img.Files, f)
	}
	w, err := HostFile(filepath.Join(o.BinDir, XtablesWrapper), "/usr/sbin/"+XtablesWrapper)
	if err != nil {
		return Image{}, err
	}
	img.Files = append(img.Files, w)
	root := o.Root
	if root == "" {
		root = "/"
	}
	var elfs []string
	for _, multi := range []string{"xtables-nft-multi", "xtables-legacy-multi"} {
		src := filepath.Join(root, "usr/sbin", multi)
		f, err := HostFile(src, "/usr/sbin/"+multi)
		if err != nil {
			return Image{}, fmt.Errorf("the image carries iptables (apt-get install iptables): %w", err)
		}
		img.Files = append(img.Files, f)
		elfs = append(elfs, src)
	}
	names := make([]string, 0, len(iptablesTools))
	for n := range iptablesTools {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		img.Files = append(img.Files, File{Path: "/usr/sbin/" + n, Link: iptablesTools[n]})
	}
	libs, err := ELFLibs(root, elfs)
	if err != nil {
		return Image{}, err
	}
	// The extensions: Debian's iptables looks in /usr/lib/<multiarch>/xtables
	// (the image has no /lib -> /usr/lib link, so that very path).
	xtDir := ""
	for _, l := range libs {
		if filepath.Base(l) == "libxtables.so.12" {
			xtDir = filepath.Join("/usr/lib", filepath.Base(filepath.Dir(l)), "xtables")
		}
	}
	exts, err := filepath.Glob(filepath.Join(root, xtDir, "*.so"))
	if err != nil || xtDir == "" || len(exts) == 0 {
		return Image{}, fmt.Errorf("no iptables extensions in %q under %s: %v", xtDir, root, err)
	}
	for _, e := range exts {
		f, err := HostFile(e, filepath.Join(xtDir, filepath.Base(e)))
		if err != nil {
			return Image{}, err
		}
		img.Files = append(img.Files, f)
	}
	extLibs, err := ELFLibs(root, exts)
	if err != nil {
		return Image{}, err
	}
	seen := map[string]bool{}
	for _, l := range append(libs, extLibs...) {
		if seen[l] {
			continue
		}
		seen[l] = true
		host, err := inRoot(root, l)
		if err != nil {
			return Image{}, err
		}
		f, err := HostFile(host, l) // read through symlinks: the file lands at its soname path
		if err != nil {
			return Image{}, err
		}
		img.Files = append(img.Files, f)
	}
	// libc resolves nothing here through NSS, but iptables looks up protocol
	// names; an empty-base image has no /etc at all otherwise (the same
	// text on every architecture).
	if f, err := HostFile("/etc/protocols", "/etc/protocols"); err == nil {
		img.Files = append(img.Files, f)
	}
	return img, nil
}

// SharedLibs lists the libraries (and the loader) the ELF files link, as ldd
// resolves them on this machine, without duplicates, sorted.
func SharedLibs(elfs []string) ([]string, error) {
	set := map[string]bool{}
	for _, e := range elfs {
		out, err := exec.Command("ldd", e).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", e, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			fields := strings.Fields(line)
			for i, f := range fields {
				if strings.HasPrefix(f, "/") && (i == 0 || fields[i-1] == "=>") {
					if _, err := os.Stat(f); err == nil {
						set[f] = true
					}
				}
			}
		}
	}
	libs := make([]string, 0, len(set))
	for l := range set {
		libs = append(libs, l)
	}
	sort.Strings(libs)
	return libs, nil
}
