package kubecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/crienv"
	"github.com/village-cni/village/internal/testenv"
)

// Node is one node: a network namespace on the LAN and one mount namespace
// (held by a supervisor process) in which containerd, kubelet and
// kube-proxy run.
type Node struct {
	Name  string // the Node object's name (kubelet --hostname-override)
	IP    string // the node's LAN address (its InternalIP)
	IP6   string // the node's IPv6 LAN address (LANPrefix6 + 10+i; in the Node object with Options.DualStack only)
	NetNS ns.NetNS
	// LANPort is the bridge port of the node's eth0 in the LAN namespace
	// (UnplugLAN takes it down).
	LANPort string

	c          *Cluster
	dir        string // the node's files; dir/fs holds its private /run, /opt, ...
	cgroupRoot string // kubelet's cgroupRoot, made in every hierarchy
	mu         sync.Mutex
	super      *testenv.Proc // holds the mount namespace
	containerd *testenv.Proc
	kubelet    *testenv.Proc
	proxy      *testenv.Proc
	stopped    bool
}

// privateDirs are the host paths each node gets its own copy of (a bind of
// dir/fs/<path> over it inside the node's mount namespace).
var privateDirs = []string{"/run", "/opt", "/etc/cni", "/var/lib", "/var/log"}

// kernelTunables are the global sysctls kubelet checks and sets, with the
// values it wants: files holding them are bound over /proc/sys inside the
// node's mount namespace, so kubelet finds them set and the host's stay.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

const containerdSocket = "/run/containerd/containerd.sock"

// newNode makes node idx's namespace, LAN link and files (started by start).
func (c *Cluster) newNode(t testing.TB, idx int) *Node {
	t.Helper()
	n := &Node{
		Name:       fmt.Sprintf("node-%d", idx),
		IP:         LANPrefix + strconv.Itoa(firstNodeOctet+idx),
		IP6:        LANPrefix6 + strconv.Itoa(firstNodeOctet+idx),
		LANPort:    fmt.Sprintf("n%d", idx),
		NetNS:      testenv.NewNS(c.t),
		c:          c,
		dir:        filepath.Join(c.dir, fmt.Sprintf("node-%d", idx)),
		cgroupRoot: fmt.Sprintf("/village-kc-%s-node-%d", c.id, idx),
	}
	c.t.Cleanup(n.stop)
	if err := c.plug(n.LANPort, n.NetNS.Path(), n.IP, n.IP6); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	return n
}

// start brings the node up: supervisor (mounts), containerd, the images,
// kubelet and kube-proxy.
func (n *Node) start() error {
	if err := n.writeFiles(); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := n.makeCgroups(); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	var err error
	n.super, err = testenv.Spawn("supervisor", n.log("supervisor"), false, "ip", "netns", "exec", filepath.Base(n.NetNS.Path()), "bash", filepath.Join(n.dir, "supervisor.sh"))
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := poll(time.Minute, func() error {
		if n.super.Exited() {
			return errors.New("supervisor exited")
		}
		_, err := os.Stat(filepath.Join(n.dir, "mounted"))
		return err
	}); err != nil {
		return fmt.Errorf("node %s: mounts: %w; log:\n%s", n.Name, err, tailFile(n.log("supervisor"), 2000))
	}
	if n.containerd, err = n.spawnIn("containerd", "containerd", "--config", filepath.Join(n.dir, "containerd.toml")); err != nil {
		return err
	}
	if err := poll(time.Minute, func() error {
		if n.containerd.Exited() {
			return errors.New("containerd exited")
		}
		_, err := n.Exec("ctr", "--address", containerdSocket, "version")
		return err
	}); err != nil {
		return fmt.Errorf("node %s: containerd: %w; log:\n%s", n.Name, err, tailFile(n.log("containerd"), 3000))
	}
	n.c.mu.Lock()
	images := append([]string(nil), n.c.images...)
	n.c.mu.Unlock()
	for _, img := range images {
		if err := n.importImage(img); err != nil {
			return err
		}
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	n.proxy, err = n.spawnIn("kube-proxy", filepath.Join(n.c.kubeDir, "kube-proxy"), "--config", filepath.Join(n.dir, "kube-proxy.yaml"), "--v=1")
	return err
}

// UnplugLAN takes the node's bridge port down in the LAN namespace: the
// node's eth0 loses carrier, as when its cable is pulled (its addresses
// and routes stay). PlugLAN puts it back.
func (n *Node) UnplugLAN() error {
	_, err := testenv.IP(n.c.lan, "link", "set", n.LANPort, "down")
	return err
}

// PlugLAN puts the node's bridge port back up (see UnplugLAN).
func (n *Node) PlugLAN() error {
	_, err := testenv.IP(n.c.lan, "link", "set", n.LANPort, "up")
	return err
}

// LANMAC is the MAC of the node's LAN interface (eth0, the macvlan master).
func (n *Node) LANMAC() (string, error) {
	var mac string
	err := testenv.InNS(n.NetNS, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr.String()
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("node %s: eth0: %w", n.Name, err)
	}
	return mac, nil
}

func (n *Node) log(name string) string { return filepath.Join(n.dir, name+".log") }

// LogPath is the file the node's process name (containerd, kubelet,
// kube-proxy) logs to, on this machine's file system.
func (n *Node) LogPath(name string) string { return n.log(name) }

// spawnIn starts a process inside the node's mount and network namespace.
func (n *Node) spawnIn(name string, argv ...string) (*testenv.Proc, error) {
	full := append([]string{"nsenter", "-t", strconv.Itoa(n.super.Pid()), "-m", "-n", "--"}, argv...)
	p, err := testenv.Spawn(name, n.log(name), true, full...)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	return p, nil
}

// Exec runs a command in the node's mount and network namespace (bounded
// at two minutes) and returns its combined output.
func (n *Node) Exec(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	full := append([]string{"-t", strconv.Itoa(n.super.Pid()), "-m", "-n", "--"}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("on %s: %s: %w: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return out, nil
}

func (n *Node) importImage(archive string) error {
	_, err := n.Exec("ctr", "--address", containerdSocket, "--namespace", "k8s.io", "images", "import", "--snapshotter", "native", archive)
	return err
}

func (n *Node) startKubelet() error {
	nodeIP := n.IP
	if n.c.opts.DualStack {
		nodeIP += "," + n.IP6
	}
	p, err := n.spawnIn("kubelet", filepath.Join(n.c.kubeDir, "kubelet"), "--config", filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig", n.c.Kubeconfig(), "--hostname-override", n.Name, "--node-ip", nodeIP, "--v=1")
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	n.mu.Unlock()
	return nil
}

// RestartKubelet stops the node's kubelet (pods keep running) and starts
// it again, returning once its healthz answers ok and the Node is Ready.
func (n *Node) RestartKubelet() error {
	n.mu.Lock()
	old := n.kubelet
	n.mu.Unlock()
	old.Stop()
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := poll(2*time.Minute, n.kubeletHealthy); err != nil {
		return fmt.Errorf("kubelet of %s after restart: %w", n.Name, err)
	}
	return n.c.WaitNodeReady(n.Name, 2*time.Minute)
}

// kubeletHealthy asks kubelet's healthz on the node's loopback.
func (n *Node) kubeletHealthy() error {
	n.mu.Lock()
	k := n.kubelet
	n.mu.Unlock()
	if k.Exited() {
		return errors.New("kubelet exited")
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := n.NetNS.Do(func(ns.NetNS) error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}}}
	resp, err := hc.Get("http://127.0.0.1:10248/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz %d: %s", resp.StatusCode, b)
	}
	return nil
}

// cgroupMount is one cgroup hierarchy of the host.
type cgroupMount struct{ point, fstype, opts string }

// hostCgroups lists the host's cgroup (v1 and v2) mounts under /sys/fs/cgroup.
func hostCgroups() ([]cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []cgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, fl := range fields {
			if fl == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fst := fields[sep+1]; (fst == "cgroup" || fst == "cgroup2") && strings.HasPrefix(fields[4], "/sys/fs/cgroup") {
			ms = append(ms, cgroupMount{point: fields[4], fstype: fst, opts: fields[sep+3]})
		}
	}
	return ms, sc.Err()
}

// makeCgroups creates kubelet's cgroupRoot in every hierarchy (cpuset's
// with its parent's cpus and mems, which a new cpuset cgroup lacks).
func (n *Node) makeCgroups() error {
	ms, err := hostCgroups()
	if err != nil {
		return err
	}
	for _, m := range ms {
		d := filepath.Join(m.point, n.cgroupRoot)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(m.point, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	return nil
}

// writeFiles writes the supervisor script and the configuration files of
// containerd, kubelet and kube-proxy.
func (n *Node) writeFiles() error {
	fs := filepath.Join(n.dir, "fs")
	for _, d := range privateDirs {
		if err := os.MkdirAll(filepath.Join(fs, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(n.dir, "sysctl"), 0o755); err != nil {
		return err
	}
	ms, err := hostCgroups()
	if err != nil {
		return err
	}
	var s strings.Builder
	s.WriteString("set -eu\n")
	s.WriteString("# ip netns exec gave this process a new mount namespace (slave of the host's)\n")
	s.WriteString("# and a sysfs of the node's network namespace over /sys, which hides the\n")
	s.WriteString("# cgroup hierarchies: mount them back (the same hierarchies as the host's).\n")
	s.WriteString("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup\n")
	for _, m := range ms {
		fmt.Fprintf(&s, "mkdir -p %s\nmount -t %s -o %s cgroup %s\n", m.point, m.fstype, m.opts, m.point)
	}
	s.WriteString("# The node's own /run, /opt, /etc/cni, /var/lib, /var/log.\n")
	for _, d := range privateDirs {
		fmt.Fprintf(&s, "mount --bind %s %s\n", filepath.Join(fs, d), d)
	}
	s.WriteString("# Shared, as a systemd host's /run is: a hostPath under it mounted into a\n")
	s.WriteString("# container with HostToContainer propagation (the DHCP grant's /var/run/netns)\n")
	s.WriteString("# sees the mounts made there after the container started (containerd's netns).\n")
	s.WriteString("mount --make-rshared /run\n")
	s.WriteString("# Global sysctls kubelet sets, pre-set in files bound over them here.\n")
	keys := make([]string, 0, len(kernelTunables))
	for k := range kernelTunables {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := filepath.Join(n.dir, "sysctl", strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(f, []byte(kernelTunables[k]+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(&s, "mount --bind %s /proc/sys/%s\n", f, k)
	}
	s.WriteString("# Per network namespace: the node's bridge netfilter setting.\n")
	fmt.Fprintf(&s, "echo %s > /proc/sys/net/bridge/bridge-nf-call-iptables\n", n.c.opts.BridgeNFCall)
	fmt.Fprintf(&s, "echo %s > /proc/sys/net/bridge/bridge-nf-call-ip6tables\n", n.c.opts.BridgeNFCall)
	s.WriteString("mkdir -p /run/containerd /var/lib/kubelet /var/log/pods\n")
	fmt.Fprintf(&s, "touch %s\n", filepath.Join(n.dir, "mounted"))
	s.WriteString("# Hold the namespaces. Should the test process die without tearing the node\n")
	s.WriteString("# down, end everything of the node: its containers, its processes, its cgroups.\n")
	fmt.Fprintf(&s, "while kill -0 %d 2>/dev/null; do sleep 2; done\n", os.Getpid())
	var cgs []string
	for _, m := range ms {
		cgs = append(cgs, filepath.Join(m.point, n.cgroupRoot))
	}
	fmt.Fprintf(&s, "find %s -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9\n", strings.Join(cgs, " "))
	s.WriteString("self=$(readlink /proc/$$/ns/mnt)\n")
	s.WriteString("for p in /proc/[0-9]*; do [ \"${p#/proc/}\" != $$ ] && [ \"$(readlink $p/ns/mnt 2>/dev/null)\" = \"$self\" ] && kill -9 ${p#/proc/} 2>/dev/null; done\n")
	s.WriteString("sleep 2\n")
	fmt.Fprintf(&s, "find %s -depth -type d -exec rmdir {} + 2>/dev/null || true\n", strings.Join(cgs, " "))
	files := map[string]string{
		"supervisor.sh": s.String(),
		"containerd.toml": crienv.Config{Root: "/var/lib/containerd", State: "/run/containerd", Socket: containerdSocket,
			Opt: "/opt/containerd", Runc: "/run/containerd/runc", BinDir: "/opt/cni/bin", ConfDir: "/etc/cni/net.d",
			SandboxImage: crienv.PauseImage}.TOML(),
		"kubelet.yaml":    n.kubeletConfig(),
		"kube-proxy.yaml": n.proxyConfig(),
		"resolv.conf":     n.resolvConf(),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) resolvConf() string {
	if n.c.opts.ClusterDNS != "" {
		return "nameserver " + n.c.opts.ClusterDNS + "\n"
	}
	// Nothing answers there; no pod's lookup leaves the test's namespaces.
	return "nameserver " + LANIP + "\n"
}

// kubeletConfig: cgroupfs driver under the node's own cgroupRoot; cgroup v1
// accepted; no swap check; anonymous and always-allowed on its port (only
// the LAN reaches it); image GC and eviction thresholds out of reach so
// imported images (no registry to pull them again) stay.
func (n *Node) kubeletConfig() string {
	extra := ""
	if n.c.opts.ClusterDNS != "" {
		extra = "clusterDNS: [" + n.c.opts.ClusterDNS + "]\n"
	}
	if n.c.opts.MaxPods > 0 {
		extra += fmt.Sprintf("maxPods: %d\n", n.c.opts.MaxPods)
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
clusterDomain: cluster.local
%sresolvConf: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.available: "1%%"}
serializeImagePulls: false
protectKernelDefaults: false
rotateCertificates: false
`, n.IP, n.cgroupRoot, containerdSocket, extra, filepath.Join(n.dir, "resolv.conf"))
}

// proxyConfig: zero conntrack settings, so kube-proxy writes no global
// conntrack sysctl.
func (n *Node) proxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: %s
clusterCIDR: %s
hostnameOverride: %s
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, n.c.Kubeconfig(), n.c.opts.ProxyMode, n.c.opts.ClusterCIDRs(), n.Name)
}

// stop ends everything of the node: kube-proxy and kubelet, every process
// in its cgroups (the containers), containerd, every process left in its
// mount namespace (shims, the supervisor); then removes its cgroups.
func (n *Node) stop() {
	n.mu.Lock()
	if n.stopped || n.super == nil {
		n.stopped = true
		n.mu.Unlock()
		return
	}
	n.stopped = true
	k := n.kubelet
	n.mu.Unlock()
	n.proxy.Stop()
	k.Stop()
	ms, _ := hostCgroups()
	killCgroups(ms, n.cgroupRoot)
	n.containerd.Stop()
	if mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.super.Pid())); err == nil {
		killMountNS(mnt)
	}
	n.super.Stop()
	removeCgroups(ms, n.cgroupRoot)
}

// killCgroups SIGKILLs every process under root in each hierarchy until
// none is left (bounded).
func killCgroups(ms []cgroupMount, root string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		found := false
		for _, m := range ms {
			_ = filepath.WalkDir(filepath.Join(m.point, root), func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, _ := strconv.Atoi(f); pid > 0 {
						found = true
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		if !found {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killMountNS SIGKILLs every process whose mount namespace is mnt.
func killMountNS(mnt string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/mnt")
	for _, p := range procs {
		if l, err := os.Readlink(p); err == nil && l == mnt {
			if pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p)))); pid > 0 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// removeCgroups removes root and everything below it, deepest first, in
// every hierarchy (retrying while the last processes leave).
func removeCgroups(ms []cgroupMount, root string) {
	for _, m := range ms {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(m.point, root), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			_ = poll(10*time.Second, func() error {
				if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
					return err
				}
				return nil
			})
		}
	}
}
