// Package armvm proves Village's arm builds on a real arm kernel: a
// full-system qemu VM (no network to the outside, -nic none) boots Debian's
// arm kernel with an initramfs built here from Debian's packages of that
// architecture (busybox-static, iproute2, the kernel's modules with depmod -b
// run on the host) and the files of Village's DaemonSet image for that
// platform (the binaries, the image's own iptables). Its init script runs the
// demo's job through cnitool, masquerade in nftables and in iptables, a VXLAN
// pair, a kernel WireGuard pair made through pkg/wireguard (which the
// test machines' kernel cannot make), `villaged sync`/`status` with static
// peers, and measures the footprint; it prints one "ARMVM PASS|FAIL <check>" line per check and
// powers off. The test fails on any FAIL or a missing check.
package armvm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/debs"
	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/internal/testenv"
)

// target is one arm platform and the VM that runs it.
type target struct {
	name       string // test name and platform, e.g. arm64
	goarch     string
	platform   ociimage.Platform
	debArch    string
	kernelMeta string   // Debian's meta package naming the current kernel
	qemu       []string // qemu command and machine
	console    string
	machine    string // uname -m inside the VM
}

var targets = []target{
	{
		name: "arm64", goarch: "arm64", platform: ociimage.Platform{OS: "linux", Architecture: "arm64"},
		debArch: "arm64", kernelMeta: "linux-image-arm64",
		qemu:    []string{"qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a57"},
		console: "ttyAMA0", machine: "aarch64",
	},
	{
		name: "armv7", goarch: "arm", platform: ociimage.Platform{OS: "linux", Architecture: "arm", Variant: "v7"},
		debArch: "armhf", kernelMeta: "linux-image-armmp",
		qemu:    []string{"qemu-system-arm", "-M", "virt", "-cpu", "cortex-a15"},
		console: "ttyAMA0", machine: "armv7l",
	},
}

// userland are the Debian packages the init script's tools come from:
// busybox for the shell and applets, iproute2 (ip netns, veth, vxlan) with
// the libraries it links.
var userland = []string{
	"busybox-static", "iproute2", "libbpf1", "libbsd0", "libcap2", "libdb5.3", "libelf1",
	"libmnl0", "libselinux1", "libtirpc3", "zlib1g", "libmd0", "libpcre2-8-0",
	"libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libcom-err2", "libkrb5support0",
	"libkeyutils1", "libssl3", "libc6",
}

// checks are the names the init script must report, each PASS.
var checks = []string{
	"kernel", "demo-add", "demo-ping", "masq-nftables", "demo-check", "demo-del", "demo-nothing-left",
	"masq-iptables", "vxlan", "wireguard-kernel", "villaged-status", "plugin-rss", "villaged-rss-5", "villaged-rss-50",
}

func TestArmVM(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) { runVM(t, tg) })
	}
}

func runVM(t *testing.T, tg target) {
	start := time.Now()
	console := bootVM(t, tg, vmSpec{script: initScript, extra: func(t testing.TB, add func(ociimage.File)) {
		// wgcheck: pkg/wireguard's kernel path, which only this VM's
		// kernel can run (the wireguard-kernel check).
		root, err := testenv.ModuleRoot()
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "wgcheck")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./test/armvm/wgcheck")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+tg.goarch, "GOARM=7")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build wgcheck for %s: %v\n%s", tg.name, err, b)
		}
		f, err := ociimage.HostFile(out, "/usr/local/bin/wgcheck")
		if err != nil {
			t.Fatal(err)
		}
		add(f)
	}})
	t.Logf("%s: whole check %s", tg.name, time.Since(start).Round(time.Second))
	report(t, tg, console, checks)
}

// vmSpec is what one VM boot runs: its /init and any files besides the
// image's, the userland's and the kernel's modules.
type vmSpec struct {
	script string
	extra  func(t testing.TB, add func(ociimage.File))
}

// bootVM builds the target's binaries and assets, boots the VM with the
// spec's init script and returns its console output.
func bootVM(t testing.TB, tg target, spec vmSpec) string {
	t.Helper()
	start := time.Now()
	qemu, err := exec.LookPath(tg.qemu[0])
	if err != nil {
		t.Fatalf("%s (scripts/deps.sh installs qemu-system-arm): %v", tg.qemu[0], err)
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bins := filepath.Join(dir, "bin")
	build(t, root, tg, bins)

	kernelPkg, err := kernelPackage(tg)
	if err != nil {
		t.Fatal(err)
	}
	kroot, err := debs.Root(tg.debArch, kernelPkg)
	if err != nil {
		t.Fatal(err)
	}
	iptRoot, err := debs.Root(tg.debArch, ociimage.IptablesPackages...)
	if err != nil {
		t.Fatal(err)
	}
	uroot, err := debs.Root(tg.debArch, userland...)
	if err != nil {
		t.Fatal(err)
	}
	img, err := ociimage.Village(ociimage.VillageOptions{Name: "village-armvm", BinDir: bins, RefDir: filepath.Join(bins, "ref"), Root: iptRoot, Platform: tg.platform})
	if err != nil {
		t.Fatal(err)
	}
	vmlinuz, files, err := initramfsFiles(t, tg, kroot, uroot, bins, img, spec)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd.gz")
	if err := writeInitramfs(initrd, files); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(initrd)
	t.Logf("%s: kernel %s, initramfs %d files %d bytes; assets ready after %s", tg.name, kernelPkg, len(files), st.Size(), time.Since(start).Round(time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := append(tg.qemu[1:], "-m", "1024", "-smp", "2", "-nographic", "-nic", "none", "-no-reboot",
		"-kernel", vmlinuz, "-initrd", initrd,
		"-append", "console="+tg.console+" panic=-1 quiet loglevel=3 rdinit=/init")
	cmd := exec.CommandContext(ctx, qemu, args...)
	var console bytes.Buffer
	logf, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout = io.MultiWriter(&console, logf)
	cmd.Stderr = cmd.Stdout
	cmd.Stdin = nil
	vmStart := time.Now()
	runErr := cmd.Run()
	t.Logf("%s: VM ran %s; qemu: %v", tg.name, time.Since(vmStart).Round(time.Second), runErr)
	return console.String()
}

// build compiles Village's binaries, cnitool and the reference portmap and
// bandwidth (the companions the image carries) for the target into dir and
// dir/ref (as build_linux.sh -arch does).
func build(t testing.TB, root string, tg target, dir string) {
	t.Helper()
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+tg.goarch, "GOARM=7")
	for _, b := range [][]string{
		{"-tags", "grpcnotrace", "-o", dir + "/", "./plugins/...", "./cmd/..."},
		{"-o", dir + "/ref/", "github.com/containernetworking/cni/cnitool", "github.com/containernetworking/plugins/plugins/meta/portmap",
			"github.com/containernetworking/plugins/plugins/meta/bandwidth"},
	} {
		if err := os.MkdirAll(filepath.Join(dir, "ref"), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("go", append([]string{"build", "-trimpath", "-ldflags", "-s -w"}, b...)...)
		cmd.Dir, cmd.Env = root, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build for %s: %v\n%s", tg.name, err, out)
		}
	}
}

// kernelPackage is the versioned kernel package the meta package depends
// on. On a machine that has never fetched the architecture apt knows no
// such package yet: the meta package's Fetch adds the architecture and
// updates apt, and the question is asked again.
func kernelPackage(tg target) (string, error) {
	var out []byte
	var err error
	for try := 0; try < 2; try++ {
		out, err = exec.Command("apt-cache", "depends", tg.kernelMeta+":"+tg.debArch).Output()
		if err == nil {
			for _, l := range strings.Split(string(out), "\n") {
				if p, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: "); ok && strings.HasPrefix(p, "linux-image-") {
					return strings.TrimSuffix(p, ":"+tg.debArch), nil
				}
			}
		}
		if try == 0 {
			if _, ferr := debs.Fetch(tg.debArch, tg.kernelMeta); ferr != nil { // adds the architecture and updates apt
				return "", ferr
			}
		}
	}
	return "", fmt.Errorf("apt-cache depends %s:%s names no kernel: %v %s", tg.kernelMeta, tg.debArch, err, out)
}

// modulePaths are the parts of the kernel's module tree the checks need:
// netfilter, bridge, veth, vxlan, dummy, wireguard and what they depend on.
var modulePaths = []string{"kernel/net", "kernel/lib", "kernel/crypto", "kernel/arch", "kernel/drivers/net/veth.ko", "kernel/drivers/net/vxlan", "kernel/drivers/net/vxlan.ko", "kernel/drivers/net/dummy.ko", "kernel/drivers/net/macvlan.ko", "kernel/drivers/net/wireguard"}

func initramfsFiles(t testing.TB, tg target, kroot, uroot, bins string, img ociimage.Image, spec vmSpec) (string, []ociimage.File, error) {
	vm, _ := filepath.Glob(filepath.Join(kroot, "boot", "vmlinuz-*"))
	if len(vm) != 1 {
		return "", nil, fmt.Errorf("kernel package under %s: %d vmlinuz", kroot, len(vm))
	}
	kver := strings.TrimPrefix(filepath.Base(vm[0]), "vmlinuz-")
	files := append([]ociimage.File(nil), img.Files...)
	have := map[string]bool{}
	for _, f := range files {
		have[filepath.Clean(f.Path)] = true
	}
	add := func(f ociimage.File) {
		if !have[filepath.Clean(f.Path)] {
			have[filepath.Clean(f.Path)] = true
			files = append(files, f)
		}
	}
	for _, p := range [][2]string{{uroot + "/bin/busybox", "/bin/busybox"}, {uroot + "/bin/ip", "/bin/ip"}, {bins + "/ref/cnitool", "/usr/local/bin/cnitool"}} {
		f, err := ociimage.HostFile(p[0], p[1])
		if err != nil {
			return "", nil, err
		}
		add(f)
	}
	libs, err := ociimage.ELFLibs(uroot, []string{filepath.Join(uroot, "bin/ip")})
	if err != nil {
		return "", nil, err
	}
	for _, l := range libs {
		host, err := filepath.EvalSymlinks(filepath.Join(uroot, l))
		if err != nil {
			// absolute symlinks inside the root (the loader)
			if t, lerr := os.Readlink(filepath.Join(uroot, l)); lerr == nil && filepath.IsAbs(t) {
				host = filepath.Join(uroot, t)
			} else {
				return "", nil, err
			}
		}
		f, err := ociimage.HostFile(host, l)
		if err != nil {
			return "", nil, err
		}
		add(f)
	}
	add(ociimage.File{Path: "/sbin/modprobe", Link: "/bin/busybox"})
	add(ociimage.File{Path: "/bin/sh", Link: "busybox"}) // the other applets: /bb, last in PATH
	add(ociimage.File{Path: "/init", Data: []byte(spec.script), Mode: 0o755})
	if spec.extra != nil {
		spec.extra(t, add)
	}
	add(ociimage.File{Path: "/etc/village/expect", Data: []byte(tg.machine + "\n")})

	// The modules the checks need, with depmod -b run here.
	mods := filepath.Join(t.TempDir(), "mods")
	src := filepath.Join(kroot, "lib/modules", kver)
	dst := filepath.Join(mods, "lib/modules", kver)
	for _, m := range append(modulePaths, "modules.order", "modules.builtin", "modules.builtin.modinfo") {
		if _, err := os.Stat(filepath.Join(src, m)); err != nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, m)), 0o755); err != nil {
			return "", nil, err
		}
		if out, err := exec.Command("cp", "-a", filepath.Join(src, m), filepath.Join(dst, m)).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("copy module %s: %v %s", m, err, out)
		}
	}
	depmod, err := exec.LookPath("depmod")
	if err != nil {
		depmod = "/sbin/depmod"
	}
	if out, err := exec.Command(depmod, "-b", mods, kver).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("depmod -b (scripts/deps.sh installs kmod): %v %s", err, out)
	}
	err = filepath.Walk(mods, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		f, err := ociimage.HostFile(p, strings.TrimPrefix(p, mods))
		if err == nil {
			add(f)
		}
		return err
	})
	return vm[0], files, err
}

// writeInitramfs writes the files as a gzip'd newc cpio archive, sorted,
// parents first.
func writeInitramfs(p string, files []ociimage.File) error {
	entries := map[string]ociimage.File{}
	for _, f := range files {
		c := filepath.Clean("/" + f.Path)
		entries[c] = f
		for d := filepath.Dir(c); d != "/"; d = filepath.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = ociimage.File{Path: d, Dir: true}
			}
		}
	}
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", "/tmp", "/var/lib/cni", "/etc/cni/net.d", "/sbin", "/usr/bin"} {
		for ; d != "/"; d = filepath.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = ociimage.File{Path: d, Dir: true}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	out, err := os.Create(p)
	if err != nil {
		return err
	}
	defer out.Close()
	zw := gzip.NewWriter(out)
	w := bufio.NewWriter(zw)
	ino := 1
	rec := func(name string, mode uint32, data []byte) {
		fmt.Fprintf(w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		ino++
		w.WriteString(name + "\x00")
		pad(w, 110+len(name)+1)
		w.Write(data)
		pad(w, len(data))
	}
	for _, n := range names {
		f := entries[n]
		name := strings.TrimPrefix(n, "/")
		perm := uint32(f.Mode.Perm())
		switch {
		case f.Dir:
			if perm == 0 {
				perm = 0o755
			}
			rec(name, 0o040000|perm, nil)
		case f.Link != "":
			rec(name, 0o120777, []byte(f.Link))
		default:
			if perm == 0 {
				perm = 0o644
			}
			rec(name, 0o100000|perm, f.Data)
		}
	}
	rec("TRAILER!!!", 0, nil)
	if err := w.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

func pad(w *bufio.Writer, n int) {
	for ; n%4 != 0; n++ {
		w.WriteByte(0)
	}
}

var resultLine = regexp.MustCompile(`ARMVM (PASS|FAIL|METRIC|DONE)\s*(\S*)\s*(.*)`)

// report fails the test on any FAIL, any missing check or a VM that did not
// finish, and logs the metrics.
func report(t testing.TB, tg target, console string, checks []string) {
	t.Helper()
	got := map[string]string{}
	done := false
	for _, l := range strings.Split(console, "\n") {
		m := resultLine.FindStringSubmatch(strings.TrimRight(l, "\r"))
		if m == nil {
			continue
		}
		switch m[1] {
		case "PASS", "FAIL":
			if got[m[2]] != "FAIL" {
				got[m[2]] = m[1]
			}
		case "METRIC":
			t.Logf("%s: %s %s", tg.name, m[2], m[3])
		case "DONE":
			done = true
		}
	}
	bad := false
	for _, c := range checks {
		if got[c] != "PASS" {
			bad = true
			t.Errorf("%s: check %s: %q", tg.name, c, got[c])
		}
	}
	if !done {
		bad = true
		t.Errorf("%s: the VM's init script did not finish", tg.name)
	}
	if bad {
		t.Logf("%s console:\n%s", tg.name, console)
	}
}
