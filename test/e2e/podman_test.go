package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
)

// podmanNet is the network name the podman test gives Village's example
// conflist (the only change besides the data dir).
const podmanNet = "villagepm"

// podman is one podman installation private to a test: its own storage
// root, run root, tmp dir, CNI config dir and containers.conf, run inside a
// node namespace so that every network object lands there.
type podman struct {
	t       *testing.T
	node    *Node
	dir     string
	cniDir  string
	dataDir string
	env     []string
	global  []string
}

// newPodman writes containers.conf and storage.conf for a podman that uses
// the CNI backend with Village's binaries and the example conflist.
func newPodman(t *testing.T, node *Node) *podman {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatalf("podman is not installed (scripts/deps.sh installs it): %v", err)
	}
	dir, err := os.MkdirTemp("", "village-podman-")
	must(t, err, "temp dir")
	p := &podman{t: t, node: node, dir: dir, cniDir: filepath.Join(dir, "cni"), dataDir: filepath.Join(dir, "ipam")}
	for _, d := range []string{"root", "runroot", "tmp", "cni"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o700), "mkdir %s", d)
	}
	// Root here lacks CAP_SYS_RESOURCE, and podman's default rlimits for a
	// rootful container (nofile and nproc raised to the kernel maximum) make
	// runc fail with EPERM; modest fixed limits need no privilege.
	conf := fmt.Sprintf(`[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[network]
network_backend = "cni"
cni_plugin_dirs = [%q, %q]
network_config_dir = %q

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
runtime = "runc"
static_dir = %q
volume_path = %q
`, testenv.Bins(t), testenv.RefBins(t), p.cniDir, filepath.Join(dir, "tmp", "events.log"),
		filepath.Join(dir, "tmp"), filepath.Join(dir, "root", "libpod"), filepath.Join(dir, "root", "volumes"))
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\nrunroot = %q\ngraphroot = %q\n", filepath.Join(dir, "runroot"), filepath.Join(dir, "root"))
	must(t, os.WriteFile(filepath.Join(dir, "containers.conf"), []byte(conf), 0o600), "containers.conf")
	must(t, os.WriteFile(filepath.Join(dir, "storage.conf"), []byte(storage), 0o600), "storage.conf")
	must(t, os.WriteFile(filepath.Join(dir, "registries.conf"), nil, 0o600), "registries.conf")
	p.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + filepath.Join(dir, "registries.conf"),
	}
	p.global = []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "runroot"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--cni-config-dir", p.cniDir, "--network-backend", "cni",
		"--cgroup-manager", "cgroupfs", "--events-backend", "file"}
	t.Cleanup(p.cleanup)
	return p
}

// run runs podman inside the node namespace (only the network namespace is
// switched: runc needs the machine's /sys and cgroup mounts, which
// `ip netns exec` would replace).
func (p *podman) run(args ...string) (string, error) {
	var out []byte
	err := p.node.in(func() error {
		cmd := exec.Command("podman", append(append([]string{}, p.global...), args...)...)
		cmd.Env = p.env
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (p *podman) must(args ...string) string {
	p.t.Helper()
	out, err := p.run(args...)
	if err != nil {
		p.t.Fatal(err)
	}
	return out
}

// cleanup removes every container (which runs CNI DEL), stops any conmon
// left for this installation, and unmounts whatever podman left under dir
// before removing it.
func (p *podman) cleanup() {
	if out, err := p.run("rm", "--all", "--force", "--time", "0"); err != nil {
		p.t.Logf("cleanup: %v\n%s", err, out)
	}
	for _, pid := range processesMentioning(p.dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	unmountUnder(p.dir)
	if err := os.RemoveAll(p.dir); err != nil {
		p.t.Logf("cleanup: %v", err)
	}
}

// processesMentioning returns the PIDs whose command line contains s
// (conmon is started with the run root in its arguments).
func processesMentioning(s string) []int {
	var pids []int
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unmountUnder lazily unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// busyboxImage builds a rootfs tar holding the static busybox and its
// applets the test uses, and imports it as an image.
func (p *podman) busyboxImage(name string) {
	p.t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	must(p.t, err, "read /bin/busybox (busybox-static; scripts/deps.sh installs it)")
	if f, err := elf.NewFile(bytes.NewReader(bb)); err != nil || slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		p.t.Fatalf("/bin/busybox is not a static ELF binary (%v): install busybox-static (scripts/deps.sh does)", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(0, 0)
	hdr := func(h *tar.Header) {
		h.ModTime = now
		must(p.t, tw.WriteHeader(h), "tar header %s", h.Name)
	}
	for _, d := range []string{"bin/", "tmp/", "w/"} {
		hdr(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	hdr(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	_, err = tw.Write(bb)
	must(p.t, err, "tar busybox")
	for _, a := range []string{"sh", "ip", "ping", "sleep", "httpd", "cat", "echo", "mkdir"} {
		hdr(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	must(p.t, tw.Close(), "tar close")
	tarPath := filepath.Join(p.dir, "rootfs.tar")
	must(p.t, os.WriteFile(tarPath, buf.Bytes(), 0o600), "write rootfs.tar")
	p.must("import", tarPath, name)
}

// podmanNetwork is what `podman inspect` reports of the container's
// attachment to the Village network.
type podmanNetwork struct {
	IPAddress, Gateway, GlobalIPv6Address, MacAddress string
}

type podmanInspect struct {
	ID              string `json:"Id"`
	NetworkSettings struct {
		SandboxKey string
		Networks   map[string]podmanNetwork
	}
}

func (p *podman) inspect(name string) podmanInspect {
	p.t.Helper()
	var out []podmanInspect
	must(p.t, json.Unmarshal([]byte(p.must("inspect", "--type", "container", name)), &out), "decode podman inspect %s", name)
	if len(out) != 1 {
		p.t.Fatalf("podman inspect %s: %d objects", name, len(out))
	}
	return out[0]
}

// TestPodmanCNIBackend runs Debian's podman 4.3 with its CNI network backend
// pointed at Village's binaries and the example conflist 10-village.conflist
// (only the name and data dir changed), inside a node namespace: two
// containers get addresses from Village, ping each other, one publishes a
// port through the chained portmap, stop and start release and take
// addresses again, and `podman rm -f` leaves no
// allocation, veth, portmap chain, netns or libcni cache entry behind.
func TestPodmanCNIBackend(t *testing.T) {
	testenv.RequireRoot(t)
	node := NewNode(t)
	p := newPodman(t, node)
	t.Logf("%s", strings.TrimSpace(p.must("--version")))

	// The machine's own CNI config (the Debian package's 87-podman-bridge)
	// is neither read nor changed.
	sysConf := "/etc/cni/net.d/87-podman-bridge.conflist"
	sysBefore, sysErrBefore := os.ReadFile(sysConf)

	b, err := os.ReadFile(filepath.Join(confDir(t), "10-village.conflist"))
	must(t, err, "read example")
	s := strings.Replace(string(b), `"name": "village"`, fmt.Sprintf("%q: %q", "name", podmanNet), 1)
	s = strings.Replace(s, `"type": "village-ipam",`, fmt.Sprintf(`"type": "village-ipam", "dataDir": %q,`, p.dataDir), 1)
	must(t, os.WriteFile(filepath.Join(p.cniDir, "10-village.conflist"), []byte(s), 0o600), "write conflist")

	nets := p.must("network", "ls", "--format", "{{.Name}} {{.Driver}}")
	if !strings.Contains(nets, podmanNet+" village") {
		t.Fatalf("podman network ls does not list %s with driver village:\n%s", podmanNet, nets)
	}

	image := "localhost/village-busybox:test"
	p.busyboxImage(image)
	p.must("run", "-d", "--name", "web", "--network", podmanNet, "-p", "18080:80", image,
		"sh", "-c", "echo village-podman-ok > /w/index.html && exec httpd -f -p 80 -h /w")
	p.must("run", "-d", "--name", "client", "--network", podmanNet, image, "sleep", "3600")

	_, subnet4, _ := net.ParseCIDR("10.244.1.0/24")
	_, subnet6, _ := net.ParseCIDR("fd00:10:244:1::/64")
	type ctr struct {
		name       string
		id         string
		ip4, ip6   string
		sandboxKey string
	}
	var ctrs []ctr
	for _, name := range []string{"web", "client"} {
		in := p.inspect(name)
		n, ok := in.NetworkSettings.Networks[podmanNet]
		if !ok {
			t.Fatalf("%s is not attached to %s: %+v", name, podmanNet, in.NetworkSettings)
		}
		if ip := net.ParseIP(n.IPAddress); ip == nil || !subnet4.Contains(ip) || n.Gateway != "10.244.1.1" {
			t.Fatalf("%s: IPv4 %q gateway %q, want an address of %s via 10.244.1.1", name, n.IPAddress, n.Gateway, subnet4)
		}
		if ip := net.ParseIP(n.GlobalIPv6Address); ip == nil || !subnet6.Contains(ip) {
			t.Fatalf("%s: IPv6 %q, want an address of %s", name, n.GlobalIPv6Address, subnet6)
		}
		// The address is on eth0 inside the container and recorded by
		// village-ipam for this container.
		addrs := p.must("exec", name, "ip", "addr", "show", "eth0")
		if !strings.Contains(addrs, n.IPAddress+"/24") || !strings.Contains(addrs, n.GlobalIPv6Address+"/64") {
			t.Fatalf("%s: eth0 inside the container lacks %s/24 or %s/64:\n%s", name, n.IPAddress, n.GlobalIPv6Address, addrs)
		}
		rec, err := os.ReadFile(filepath.Join(p.dataDir, podmanNet, n.IPAddress))
		must(t, err, "allocation file of %s", name)
		if !strings.HasPrefix(string(rec), in.ID) {
			t.Fatalf("allocation %s holds %q, want container %s", n.IPAddress, rec, in.ID)
		}
		ctrs = append(ctrs, ctr{name: name, id: in.ID, ip4: n.IPAddress, ip6: n.GlobalIPv6Address, sandboxKey: in.NetworkSettings.SandboxKey})
	}

	// Container to container, both families.
	for _, dst := range []string{ctrs[0].ip4, ctrs[0].ip6} {
		p.must("exec", "client", "ping", "-c", "2", "-W", "2", dst)
	}
	// The published port, from the node, through portmap's DNAT to web.
	var page string
	var werr error
	for i := 0; i < 50; i++ { // httpd may still be starting
		// (busybox 1.35's wget crashes with -T; the context bounds it.)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", node.Name(), "busybox", "wget", "-q", "-O", "-", "http://10.244.1.1:18080/").CombinedOutput()
		cancel()
		if page, werr = string(out), err; err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.TrimSpace(page) != "village-podman-ok" {
		t.Fatalf("node -> 10.244.1.1:18080 (published by web) answered %q (%v), want village-podman-ok; web's log:\n%s", page, werr, p.must("logs", "web"))
	}

	// podman stop tears client's network down (DEL) and start sets it up
	// again (ADD) in a new netns.
	p.must("stop", "--time", "0", "client")
	if allocs := ipFiles(t, p.dataDir); len(allocs) != 2 {
		t.Fatalf("after podman stop client: allocations %v, want web's two", allocs)
	}
	if _, err := os.Stat(ctrs[1].sandboxKey); !os.IsNotExist(err) {
		t.Fatalf("netns %s of the stopped client still there (%v)", ctrs[1].sandboxKey, err)
	}
	p.must("start", "client")
	restarted := p.inspect("client")
	ctrs[1].sandboxKey = restarted.NetworkSettings.SandboxKey
	if allocs := ipFiles(t, p.dataDir); len(allocs) != 4 {
		t.Fatalf("after podman start client: allocations %v, want four", allocs)
	}
	p.must("exec", "client", "ping", "-c", "1", "-W", "2", ctrs[0].ip4)

	// Everything the two containers own exists before the removal...
	owned := func() (allocs, veths []string, nat string, cache []string) {
		allocs = ipFiles(t, p.dataDir)
		for _, l := range strings.Split(testenv.MustIP(t, node.NS, "-o", "link", "show", "type", "veth"), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				veths = append(veths, strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"))
			}
		}
		nat = inNS(t, node.NS, "iptables-save", "-t", "nat")
		for _, c := range ctrs {
			m, _ := filepath.Glob("/var/lib/cni/results/" + podmanNet + "-" + c.id + "-*")
			cache = append(cache, m...)
		}
		return
	}
	allocs, veths, nat, cache := owned()
	if len(allocs) != 4 || len(veths) != 2 || !strings.Contains(nat, ctrs[0].id) || len(cache) != 2 {
		t.Fatalf("before rm: allocations %v, veths %v, cache %v, want 4, 2, 2; portmap rule for %s present: %v",
			allocs, veths, cache, ctrs[0].id, strings.Contains(nat, ctrs[0].id))
	}
	for _, c := range ctrs {
		if _, err := os.Stat(c.sandboxKey); err != nil {
			t.Fatalf("netns of %s: %v", c.name, err)
		}
	}

	// ...and nothing after it.
	p.must("rm", "--force", "--time", "0", "web", "client")
	allocs, veths, nat, cache = owned()
	if len(allocs) != 0 || len(veths) != 0 || strings.Contains(nat, "CNI-DN-") || len(cache) != 0 {
		t.Fatalf("after rm: allocations %v, veths %v, libcni cache %v, nat:\n%s", allocs, veths, cache, nat)
	}
	for _, c := range ctrs {
		if _, err := os.Stat(c.sandboxKey); !os.IsNotExist(err) {
			t.Fatalf("netns %s of %s still there after rm (%v)", c.sandboxKey, c.name, err)
		}
		if pids := processesMentioning(c.id); len(pids) > 0 {
			t.Fatalf("processes of %s still running after rm: %v", c.name, pids)
		}
	}
	// The bridge, gateway and masquerade rules are the node's and stay.
	testenv.MustIP(t, node.NS, "link", "show", "village0")
	// (The nftables backend is the automatic choice on this iptables-nft host.)
	if rs := inNS(t, node.NS, "nft", "list", "table", "inet", "village-"+podmanNet); !strings.Contains(rs, `masquerade comment "village:`+podmanNet+`"`) {
		t.Fatalf("masquerade rules of %s gone after rm (they are per node, not per pod):\n%s", podmanNet, rs)
	}

	// podman keeps a cni.lock there; no other network appeared.
	if confs, _ := filepath.Glob(filepath.Join(p.cniDir, "*.conf*")); len(confs) != 1 {
		t.Fatalf("podman wrote a network config into its CNI config dir: %v", confs)
	}
	sysAfter, sysErrAfter := os.ReadFile(sysConf)
	if !bytes.Equal(sysBefore, sysAfter) || (sysErrBefore == nil) != (sysErrAfter == nil) {
		t.Fatalf("%s changed during the test", sysConf)
	}
}
