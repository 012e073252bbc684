// Package runtime tests Village under a real container runtime: Debian's
// containerd 1.6 with runc, started by the test inside a node namespace (see
// internal/crienv), driven over CRI by crictl exactly as the kubelet drives
// it, with the shipped conf/10-village.conflist (paths and network name
// changed only) and the chained reference portmap and bandwidth.
package runtime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/village-cni/village/internal/crienv"
	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/install"
)

const hostPort = 18080

// cri is one containerd of a test with the facts the checks need.
type cri struct {
	t       *testing.T
	env     *crienv.Env
	node    ns.NetNS
	net     string // CNI network name
	dir     string
	dataDir string // village-ipam's allocations
	logFile string // the plugins' logFile
}

func TestContainerd(t *testing.T) {
	testenv.RequireRoot(t)
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	crictl, err := crienv.BuildCrictl(root)
	if err != nil {
		t.Fatal(err)
	}
	bins, ref := testenv.Bins(t), testenv.RefBins(t)
	c := &cri{t: t, node: testenv.NewNS(t), net: fmt.Sprintf("vcri%d", os.Getpid()), dir: t.TempDir()}
	c.dataDir = filepath.Join(c.dir, "ipam")
	c.logFile = filepath.Join(c.dir, "cni.log")

	images := filepath.Join(c.dir, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	pauseTar, toolsTar, err := crienv.BuildImages(root, images)
	if err != nil {
		t.Fatal(err)
	}
	villageImg, err := ociimage.Village(ociimage.VillageOptions{Name: buildinfo.Image, BinDir: bins, RefDir: ref})
	if err != nil {
		t.Fatal(err)
	}
	villageTar := filepath.Join(images, "village.tar")
	if err := ociimage.WriteFile(villageTar, villageImg); err != nil {
		t.Fatal(err)
	}

	env, err := crienv.Start(crienv.Options{
		Dir:   filepath.Join(c.dir, "containerd"),
		NetNS: c.node.Path(),
		CNIBins: map[string]string{
			"village":      filepath.Join(bins, "village"),
			"village-ipam": filepath.Join(bins, "village-ipam"),
			"loopback":     filepath.Join(bins, "loopback"),
			"portmap":      filepath.Join(ref, "portmap"),
			"bandwidth":    filepath.Join(ref, "bandwidth"),
		},
		Confs:        map[string][]byte{"10-village.conflist": c.conflist(root)},
		SandboxImage: crienv.PauseImage,
		CrictlBin:    crictl,
	})
	if env != nil {
		c.env = env
		t.Cleanup(func() {
			if err := env.Stop(); err != nil {
				t.Errorf("stopping containerd: %v", err)
			}
			if t.Failed() {
				t.Logf("containerd log (tail):\n%s", env.Log())
				b, _ := os.ReadFile(c.logFile)
				t.Logf("plugin log:\n%s", b)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{pauseTar, toolsTar, villageTar} {
		if err := env.Import(img); err != nil {
			t.Fatalf("import %s: %v", filepath.Base(img), err)
		}
	}
	t.Logf("containerd up in %s; crictl %s", c.node.Path(), crictl)

	// Several pods: addresses and routes as configured, pings.
	// p1 asks for bandwidth limits by the pod annotations Kubernetes
	// defines; containerd hands them to the chained bandwidth plugin.
	pods := []*pod{c.runPod("p0", true), c.runPod("p1", false, bandwidthAnnotations), c.runPod("p2", false)}
	for _, p := range pods {
		c.checkAddresses(p)
	}
	c.mustPing(pods[0], pods[1].ip4)
	c.mustPing(pods[0], pods[1].ip6)
	c.mustPing(pods[1], pods[2].ip4)
	c.mustPingFromNode(pods[2].ip4)
	c.mustPingFromNode(pods[2].ip6)
	c.expectShaped(pods[1], pods[0], pods[2])

	// Something to clean up exists now: veths, allocations, cache entries,
	// portmap's per-pod chain, netns.
	c.expectState(len(pods), true)
	for _, p := range pods {
		if _, err := os.Stat(p.netns); err != nil {
			t.Errorf("pod %s: its netns %s: %v", p.name, p.netns, err)
		}
	}

	// A container in a pod: it shares the pod's network (crictl exec), and
	// answers behind the hostPort the pod's config maps through portmap.
	ctr := c.createContainer(pods[0], container{name: "server", image: crienv.ToolsImage, command: []string{"/pause", "-listen", ":8080", "-reply", "hello from p0"}})
	out := c.crictl("exec", ctr, "ip", "-o", "addr", "show", "dev", "eth0")
	for _, ip := range []string{pods[0].ip4, pods[0].ip6} {
		if !strings.Contains(out, ip+"/") {
			t.Errorf("crictl exec in p0's container: eth0 lacks %s:\n%s", ip, out)
		}
	}
	c.expectHostPort("127.0.0.1", "hello from p0")
	c.expectHostPort("10.244.1.1", "hello from p0")

	// The DaemonSet's image: villaged version, iptables, the install init
	// container's own command against sandbox directories.
	c.villageImage(root, bins, ref)

	// A pod whose netns disappeared before the runtime stopped it: the DELs
	// (the second with an empty CNI_NETNS) still free everything.
	gone := c.runPod("p3", false)
	if out, err := exec.Command("ip", "netns", "delete", filepath.Base(gone.netns)).CombinedOutput(); err != nil {
		t.Fatalf("remove p3's netns: %v: %s", err, out)
	}
	pods = append(pods, gone)

	for _, p := range pods {
		c.crictl("stopp", p.id)
		c.crictl("rmp", p.id)
	}
	if out := c.crictl("pods", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("pods left after rmp: %s", out)
	}
	c.expectState(0, false)
	c.checkDELs(len(pods))
	// Only the namespaces this test's pods had (their paths from inspectp,
	// each seen to exist above): other tests make cni-* namespaces too.
	for _, p := range pods {
		if _, err := os.Stat(p.netns); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("pod %s: its network namespace %s is left behind (%v)", p.name, p.netns, err)
		}
	}
}

// conflist is conf/10-village.conflist with only the network name and the
// paths (IPAM data, plugin log) changed.
func (c *cri) conflist(root string) []byte {
	b, err := os.ReadFile(filepath.Join(root, "conf", "10-village.conflist"))
	if err != nil {
		c.t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatal(err)
	}
	m["name"] = c.net
	plugins := m["plugins"].([]any)
	main := plugins[0].(map[string]any)
	main["logFile"] = c.logFile
	main["ipam"].(map[string]any)["dataDir"] = c.dataDir
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := libcni.ConfListFromBytes(out); err != nil {
		c.t.Fatalf("conflist: %v", err)
	}
	return out
}

func (c *cri) crictl(args ...string) string {
	c.t.Helper()
	out, err := c.env.Crictl(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

type pod struct {
	name, id, netns, ip4, ip6 string
}

func (c *cri) podConfig(name string, ports bool, annotations map[string]string) string {
	cfg := map[string]any{
		"annotations":   annotations,
		"metadata":      map[string]any{"name": name, "namespace": "village-test", "uid": name + "-uid", "attempt": 0},
		"hostname":      name,
		"log_directory": filepath.Join(c.env.LogDir, name),
		"linux":         map[string]any{},
	}
	if ports {
		cfg["port_mappings"] = []any{map[string]any{"protocol": 0, "container_port": 8080, "host_port": hostPort}}
	}
	b, _ := json.Marshal(cfg)
	p := filepath.Join(c.dir, "pod-"+name+".json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// runPod runs a pod sandbox (the CNI ADD), with the annotations given,
// and reads its netns and addresses
// as CRI reports them.
func (c *cri) runPod(name string, ports bool, annotations ...map[string]string) *pod {
	c.t.Helper()
	var ann map[string]string
	for _, a := range annotations {
		ann = a
	}
	id := c.crictl("runp", c.podConfig(name, ports, ann))
	var st struct {
		Status struct {
			Network struct {
				IP            string `json:"ip"`
				AdditionalIPs []struct {
					IP string `json:"ip"`
				} `json:"additionalIps"`
			} `json:"network"`
		} `json:"status"`
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct {
						Type, Path string
					} `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	out := c.crictl("inspectp", "-o", "json", id)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		c.t.Fatalf("inspectp %s: %v\n%s", name, err, out)
	}
	p := &pod{name: name, id: id}
	for _, n := range st.Info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" {
			p.netns = n.Path
		}
	}
	for _, ip := range append([]string{st.Status.Network.IP}, func() (s []string) {
		for _, a := range st.Status.Network.AdditionalIPs {
			s = append(s, a.IP)
		}
		return
	}()...) {
		if strings.Contains(ip, ":") {
			p.ip6 = ip
		} else if ip != "" {
			p.ip4 = ip
		}
	}
	if p.netns == "" || p.ip4 == "" || p.ip6 == "" {
		c.t.Fatalf("pod %s: CRI reports netns %q, IPv4 %q, IPv6 %q; want all three:\n%s", name, p.netns, p.ip4, p.ip6, out)
	}
	return p
}

// checkAddresses: the pod's eth0 holds what CRI reported, from the
// configured ranges, and its default routes go through the bridge.
func (c *cri) checkAddresses(p *pod) {
	c.t.Helper()
	_, n4, _ := net.ParseCIDR("10.244.1.0/24")
	_, n6, _ := net.ParseCIDR("fd00:10:244:1::/64")
	if !n4.Contains(net.ParseIP(p.ip4)) || !n6.Contains(net.ParseIP(p.ip6)) {
		c.t.Errorf("pod %s got %s and %s, outside the conflist's ranges", p.name, p.ip4, p.ip6)
	}
	podNS := filepath.Base(p.netns)
	addrs := ipOut(c.t, "-n", podNS, "-o", "addr", "show", "dev", "eth0")
	for _, ip := range []string{p.ip4 + "/24", p.ip6 + "/64"} {
		if !strings.Contains(addrs, ip) {
			c.t.Errorf("pod %s: eth0 lacks %s:\n%s", p.name, ip, addrs)
		}
	}
	if r := ipOut(c.t, "-n", podNS, "-4", "route", "show", "default"); !strings.Contains(r, "via 10.244.1.1 dev eth0") {
		c.t.Errorf("pod %s: IPv4 default route %q, want via 10.244.1.1 dev eth0", p.name, r)
	}
	if r := ipOut(c.t, "-n", podNS, "-6", "route", "show", "default"); !strings.Contains(r, "via fd00:10:244:1::1 dev eth0") {
		c.t.Errorf("pod %s: IPv6 default route %q, want via fd00:10:244:1::1 dev eth0", p.name, r)
	}
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ping polls (IPv6 addresses need their duplicate address detection first).
func ping(netns, dst string) error {
	var err error
	for i := 0; i < 15; i++ {
		args := []string{"netns", "exec", netns, "ping", "-c", "1", "-W", "2", dst}
		var out []byte
		out, err = exec.Command("ip", args...).CombinedOutput()
		if err == nil {
			return nil
		}
		err = fmt.Errorf("ping %s from %s: %w: %s", dst, netns, err, out)
		time.Sleep(time.Second)
	}
	return err
}

func (c *cri) mustPing(from *pod, dst string) {
	c.t.Helper()
	if err := ping(filepath.Base(from.netns), dst); err != nil {
		c.t.Error(err)
	}
}

func (c *cri) mustPingFromNode(dst string) {
	c.t.Helper()
	if err := ping(filepath.Base(c.node.Path()), dst); err != nil {
		c.t.Error(err)
	}
}

// container is one container of a test pod.
type container struct {
	name, image string
	command     []string
	mounts      []any
	env         map[string]string
	caps        []string // capabilities added after dropping all (nil: the runtime's default set)
	// wait: wait for the container to exit (it must exit 0) and return its
	// log instead of its ID.
	wait bool
}

// createContainer creates and starts a container in p, read-only root file
// system like the DaemonSet's.
func (c *cri) createContainer(p *pod, ct container) string {
	c.t.Helper()
	var envs []any
	for k, v := range ct.env {
		envs = append(envs, map[string]any{"key": k, "value": v})
	}
	sc := map[string]any{"readonly_rootfs": true}
	if ct.caps != nil {
		sc["capabilities"] = map[string]any{"drop_capabilities": []string{"ALL"}, "add_capabilities": ct.caps}
	}
	cfg := map[string]any{
		"metadata": map[string]any{"name": ct.name},
		"image":    map[string]any{"image": ct.image},
		"command":  ct.command,
		"envs":     envs,
		"mounts":   ct.mounts,
		"log_path": ct.name + ".log",
		"linux":    map[string]any{"security_context": sc},
	}
	b, _ := json.Marshal(cfg)
	cf := filepath.Join(c.dir, "ctr-"+p.name+"-"+ct.name+".json")
	if err := os.WriteFile(cf, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	id := c.crictl("create", p.id, cf, filepath.Join(c.dir, "pod-"+p.name+".json"))
	c.crictl("start", id)
	if !ct.wait {
		return id
	}
	var state string
	for i := 0; i < 120; i++ {
		state = c.crictl("inspect", "-o", "go-template", "--template", "{{.status.state}} {{.status.exitCode}}", id)
		if strings.HasPrefix(state, "CONTAINER_EXITED") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	logs, err := c.env.ContainerLogs(id)
	if state != "CONTAINER_EXITED 0" {
		c.t.Fatalf("container %s (%s) ended %q; logs (%v):\n%s", ct.name, strings.Join(ct.command, " "), state, err, logs)
	}
	return logs
}

// expectHostPort connects from the node to addr:hostPort and expects the
// server in p0 to answer (portmap's DNAT, chained after village).
func (c *cri) expectHostPort(addr, want string) {
	c.t.Helper()
	var got string
	var err error
	for i := 0; i < 30; i++ {
		err = testenv.InNS(c.node, func() error {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr, fmt.Sprint(hostPort)), 3*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(conn).ReadString('\n')
			got = strings.TrimSpace(line)
			return err
		})
		if err == nil && got == want {
			return
		}
		time.Sleep(time.Second)
	}
	c.t.Errorf("hostPort %s:%d from the node: got %q, %v; want %q", addr, hostPort, got, err, want)
}

// villageImage runs the DaemonSet's image: villaged version, the iptables it
// carries, and the install init container's command (taken from
// deploy/kubernetes) against sandbox /opt/cni/bin, /etc/cni/net.d and state
// directories, with the ConfigMap's template mounted where the manifest
// mounts it.
func (c *cri) villageImage(root, bins, refBins string) {
	t := c.t
	t.Helper()
	ds, cm := manifests(t, root)
	inst := findContainer(ds.Spec.Template.Spec.InitContainers, "install")
	agent := findContainer(ds.Spec.Template.Spec.Containers, "agent")
	if inst == nil || inst.Image != buildinfo.Image || agent == nil || agent.Image != buildinfo.Image {
		t.Fatalf("the DaemonSet has no install init container and agent container running %s", buildinfo.Image)
	}
	p := c.runPod("village", false)
	defer func() {
		c.crictl("stopp", p.id)
		c.crictl("rmp", p.id)
	}()
	if out := c.createContainer(p, container{name: "version", image: buildinfo.Image, command: []string{"villaged", "version"}, wait: true}); !strings.Contains(out, buildVersion(t, bins)) {
		t.Errorf("villaged version in the image printed %q, want %q", out, buildVersion(t, bins))
	}
	if out := c.createContainer(p, container{name: "iptables", image: buildinfo.Image, command: []string{"iptables", "--version"}, wait: true}); !regexp.MustCompile(`iptables v1\.\d+\.\d+ \(nf_tables\)`).MatchString(out) {
		t.Errorf("iptables --version in the image printed %q", out)
	}
	// The image's iptables and ip6tables write a masquerade rule of the shape
	// pkg/masq writes (comment match, MASQUERADE target: extensions loaded
	// from the image) with the agent container's capabilities only; the
	// node's own iptables-save sees it in the pod's namespace.
	// The agent's /run/xtables.lock mount (iptables-legacy takes that lock;
	// the root file system is read-only).
	lock := filepath.Join(c.dir, "xtables.lock")
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	agentMounts := []any{map[string]any{"container_path": "/run/xtables.lock", "host_path": lock}}
	for _, ipt := range []struct{ bin, src string }{{"iptables", "10.99.0.0/16"}, {"ip6tables", "fd00:99::/64"}} {
		c.createContainer(p, container{name: ipt.bin + "-masq", image: agent.Image, caps: addedCaps(agent), mounts: agentMounts, wait: true,
			command: []string{ipt.bin, "-t", "nat", "-A", "POSTROUTING", "-s", ipt.src, "-m", "comment", "--comment", "village:image-test", "-j", "MASQUERADE"}})
		save := ipt.bin + "-save"
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(p.netns), save, "-t", "nat").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "-A POSTROUTING -s "+ipt.src+` -m comment --comment "village:image-test" -j MASQUERADE`) {
			t.Errorf("the image's %s did not write its masquerade rule in the pod's namespace (%v):\n%s", ipt.bin, err, out)
		}
	}
	// Once legacy tables exist in the namespace (a node on iptables-legacy),
	// the image's iptables is the legacy one: the variant the agent's
	// backend detection then picks, and the plugin on such a node uses.
	c.createContainer(p, container{name: "legacy-tables", image: agent.Image, caps: addedCaps(agent), mounts: agentMounts, wait: true,
		command: []string{"iptables-legacy", "-t", "nat", "-S"}})
	if out := c.createContainer(p, container{name: "iptables-legacy-node", image: agent.Image, command: []string{"iptables", "--version"}, wait: true}); !strings.Contains(out, "(legacy)") {
		t.Errorf("with legacy tables in the namespace the image's iptables --version printed %q, want the legacy variant", out)
	}

	sandbox := map[string]string{}
	var mounts []any
	for _, m := range inst.VolumeMounts {
		host := filepath.Join(c.dir, "install", strings.ReplaceAll(strings.Trim(m.MountPath, "/"), "/", "_"))
		if err := os.MkdirAll(host, 0o755); err != nil {
			t.Fatal(err)
		}
		sandbox[m.MountPath] = host
		mounts = append(mounts, map[string]any{"container_path": m.MountPath, "host_path": host, "readonly": m.ReadOnly})
	}
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(sandbox["/etc/village/template"], k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet expands $(VAR) from the container's env; do the same.
	vars := map[string]string{"NODE_NAME": "node-a", "NODE_IP": "192.0.2.10"}
	for _, e := range inst.Env {
		if e.Value != "" {
			vars[e.Name] = e.Value
		}
	}
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	var cmd []string
	for _, a := range append(append([]string(nil), inst.Command...), inst.Args...) {
		cmd = append(cmd, varRef.ReplaceAllStringFunc(a, func(m string) string { return vars[varRef.FindStringSubmatch(m)[1]] }))
	}
	out := c.createContainer(p, container{name: "install", image: inst.Image, command: cmd, mounts: mounts, env: vars, caps: addedCaps(inst), wait: true})
	t.Logf("install init container: %s", strings.TrimSpace(out))

	binDir, confDir := sandbox["/opt/cni/bin"], sandbox["/etc/cni/net.d"]
	for _, b := range append(slices.Clone(install.Plugins), install.Companions...) {
		got, err := os.ReadFile(filepath.Join(binDir, b))
		want, _ := os.ReadFile(filepath.Join(bins, b))
		if slices.Contains(install.Companions, b) {
			want, _ = os.ReadFile(filepath.Join(refBins, b)) // the sandbox bin dir had no companions: the image's go in
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("install did not put %s (the image's copy) into the sandbox /opt/cni/bin: %v", b, err)
		}
		if st, err := os.Stat(filepath.Join(binDir, b)); err == nil && st.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s installed without execute permission: %v", b, st.Mode())
		}
	}
	// The DaemonSet's install stages the conflist (the agent publishes it in
	// /etc/cni/net.d once it holds the pod subnet): none in the config
	// directory yet, the rendered one in the staging directory.
	if _, err := os.Stat(filepath.Join(confDir, "10-village.conflist")); err == nil {
		t.Errorf("install wrote the conflist into the config directory although it stages it")
	}
	stage := ""
	for i, a := range cmd {
		if a == "--stage-dir" && i+1 < len(cmd) {
			stage = cmd[i+1]
		}
	}
	rel, err := filepath.Rel("/var/lib/village", stage)
	if stage == "" || err != nil || strings.HasPrefix(rel, "..") {
		t.Fatalf("install --stage-dir %q: want a directory under the mounted /var/lib/village", stage)
	}
	conf, err := os.ReadFile(filepath.Join(sandbox["/var/lib/village"], rel, "10-village.conflist"))
	if err != nil {
		t.Fatalf("install staged no conflist: %v", err)
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil || list.Name != "village" || len(list.Plugins) != 3 || list.Plugins[0].Network.Type != "village" ||
		list.Plugins[1].Network.Type != "portmap" || list.Plugins[2].Network.Type != "bandwidth" || !list.Plugins[2].Network.Capabilities["bandwidth"] {
		t.Errorf("installed conflist does not load as the village network (%v):\n%s", err, conf)
	}
	if strings.Contains(string(conf), "${") {
		t.Errorf("installed conflist still has template placeholders:\n%s", conf)
	}
	if _, err := os.Stat(filepath.Join(sandbox["/var/lib/village"], "install.json")); err != nil {
		t.Errorf("install recorded nothing in its state dir: %v", err)
	}
}

func findContainer(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// addedCaps is what a manifest's container keeps after dropping ALL (never
// nil, so createContainer drops the runtime's default set too).
func addedCaps(c *corev1.Container) []string {
	caps := []string{}
	if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil {
		for _, a := range sc.Capabilities.Add {
			caps = append(caps, string(a))
		}
	}
	return caps
}

func buildVersion(t *testing.T, bins string) string {
	out, err := exec.Command(filepath.Join(bins, "villaged"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("villaged version: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

func manifests(t *testing.T, root string) (*appsv1.DaemonSet, *corev1.ConfigMap) {
	t.Helper()
	var ds appsv1.DaemonSet
	var cm corev1.ConfigMap
	for f, v := range map[string]any{"daemonset.yaml": &ds, "configmap.yaml": &cm} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return &ds, &cm
}

// expectState counts what pods leave on the node: host veths, IPAM
// allocations, libcni cache entries and portmap's per-pod DNAT chains. With
// present it wants at least n of each, else none at all.
func (c *cri) expectState(n int, present bool) {
	t := c.t
	t.Helper()
	veths := 0
	if out := strings.TrimSpace(testenv.MustIP(t, c.node, "-o", "link", "show", "type", "veth")); out != "" {
		veths = len(strings.Split(out, "\n"))
	}
	allocs := 0
	ents, _ := os.ReadDir(filepath.Join(c.dataDir, c.net))
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			allocs++
		}
	}
	cache, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", c.net+"-*"))
	var rules bytes.Buffer
	cmd := exec.Command("iptables-save", "-t", "nat")
	cmd.Stdout = &rules
	if err := testenv.InNS(c.node, cmd.Run); err != nil {
		t.Fatalf("iptables-save in the node: %v", err)
	}
	chains := len(regexp.MustCompile(`(?m)^:CNI-DN-`).FindAllString(rules.String(), -1))
	got := map[string]int{"host veths": veths, "IPAM allocations": allocs, "libcni cache entries": len(cache)}
	if present {
		for what, k := range got {
			if k < n {
				t.Errorf("%d pods running but %d %s", n, k, what)
			}
		}
		if chains == 0 {
			t.Errorf("a pod with a hostPort runs but portmap made no CNI-DN- chain:\n%s", rules.String())
		}
		return
	}
	for what, k := range got {
		if k != 0 {
			t.Errorf("every pod removed but %d %s left", k, what)
		}
	}
	if chains != 0 {
		t.Errorf("every pod removed but %d CNI-DN- chains left:\n%s", chains, rules.String())
	}
}

// checkDELs reads the plugin's log: every verb succeeded, and the runtime
// repeated DEL with an empty CNI_NETNS (what containerd does on
// RemovePodSandbox, and on StopPodSandbox once the netns is gone).
func (c *cri) checkDELs(pods int) {
	t := c.t
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		t.Fatalf("plugin log: %v", err)
	}
	dels, emptyNetns := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var l struct {
			Msg, Level, Netns, Result, Plugin string
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Errorf("plugin log line %q: %v", line, err)
			continue
		}
		if l.Level != "INFO" {
			t.Errorf("plugin logged a failure: %s", line)
		}
		if l.Plugin == "village" && strings.HasPrefix(l.Msg, "DEL") {
			dels++
			if l.Netns == "" {
				emptyNetns++
			}
		}
	}
	t.Logf("plugin log: %d DELs for %d pods, %d with an empty CNI_NETNS", dels, pods, emptyNetns)
	if dels < pods || emptyNetns == 0 {
		t.Errorf("want at least one DEL per pod (%d) and some with an empty CNI_NETNS; got %d DELs, %d with empty netns", pods, dels, emptyNetns)
	}
}

// bandwidthAnnotations ask for 8 Mbit/s each way, as a pod's manifest does.
var bandwidthAnnotations = map[string]string{"kubernetes.io/ingress-bandwidth": "8M", "kubernetes.io/egress-bandwidth": "8M"}

// expectShaped: the pod that asked for bandwidth limits has them on its
// host veth (a token bucket and an ingress redirect to its one ifb), the
// others none. The rates themselves are measured in test/e2e
// TestBandwidthOnlyItsPod.
func (c *cri) expectShaped(shaped *pod, others ...*pod) {
	t := c.t
	t.Helper()
	qdiscs := func(p *pod) string {
		return c.nodeCmd("tc", "qdisc", "show", "dev", c.hostVeth(p))
	}
	if q := qdiscs(shaped); !strings.Contains(q, "qdisc tbf") || !strings.Contains(q, "qdisc ingress") {
		t.Errorf("pod %s annotated with %v: its host veth has qdiscs\n%s\nwant tbf and ingress", shaped.name, bandwidthAnnotations, q)
	}
	if ifbs := strings.TrimSpace(c.nodeCmd("ip", "-o", "link", "show", "type", "ifb")); strings.Count(ifbs, "\n") != 0 || ifbs == "" {
		t.Errorf("ifb devices on the node: %q, want the annotated pod's alone", ifbs)
	}
	for _, p := range others {
		if q := qdiscs(p); strings.Contains(q, "tbf") || strings.Contains(q, "ingress") {
			t.Errorf("pod %s asked for no limit, but its host veth has qdiscs\n%s", p.name, q)
		}
	}
}

// hostVeth is the node-side name of p's eth0 veth (eth0@ifN in the pod:
// N is its peer's index on the node).
func (c *cri) hostVeth(p *pod) string {
	c.t.Helper()
	out, err := exec.Command("ip", "-n", filepath.Base(p.netns), "-o", "link", "show", "dev", "eth0").CombinedOutput()
	m := regexp.MustCompile(`eth0@if(\d+):`).FindStringSubmatch(string(out))
	if err != nil || m == nil {
		c.t.Fatalf("pod %s: eth0 in %s: %v: %s", p.name, p.netns, err, out)
	}
	for _, l := range strings.Split(c.nodeCmd("ip", "-o", "link"), "\n") {
		if idx, rest, ok := strings.Cut(l, ": "); ok && idx == m[1] {
			name, _, _ := strings.Cut(rest, "@")
			return strings.TrimSuffix(name, ":")
		}
	}
	c.t.Fatalf("pod %s: no link with index %s on the node", p.name, m[1])
	return ""
}

// nodeCmd runs a command in the node's namespace, failing on error.
func (c *cri) nodeCmd(name string, args ...string) string {
	c.t.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := testenv.InNS(c.node, cmd.Run); err != nil {
		c.t.Fatalf("%s %v in the node: %v: %s", name, args, err, out.String())
	}
	return out.String()
}
