// Package kubecluster runs a real Kubernetes cluster for tests on one
// machine, with Village installed the way a user installs it: the shipped
// deploy/kubernetes manifests applied with kubectl and the image
// `./build_linux.sh image` builds (through the same internal/ociimage/mkimage).
//
// Layout: a LAN namespace holds a bridge (LANPrefix.1/24, LANPrefix6:1/64) and the control
// plane — etcd and kube-apiserver (internal/kubetest), kube-controller-manager
// allocating Node podCIDRs from ClusterCIDR, kube-scheduler. Every node is a
// network namespace with a veth on that bridge and one mount namespace of its
// own (a supervisor started with one `ip netns exec`) in which containerd
// 1.6, kubelet and kube-proxy run: private /run, /opt, /etc/cni, /var/lib
// and /var/log, so the DaemonSet's hostPaths work unchanged and nodes stay
// apart; cgroup v1 hierarchies mounted back (ip netns exec remounts /sys);
// files bound over the global sysctls kubelet writes so the host's stay as
// they are; kube-proxy told to write no conntrack sysctl. The harness keeps a
// route per Node podCIDR via the node's address in the LAN namespace, so the
// API server and clients there reach pods.
//
// Every client runs inside the LAN namespace: Client dials from it, and
// Kubectl/RunInLAN start processes in it. Nothing touches the root
// namespace's network. Kubelets and kube-proxies authenticate with the
// admin token (system:masters), not per-node identities: simple, and the
// Node authorizer is not what these tests are about.
package kubecluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/village-cni/village/internal/crienv"
	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
)

// Addresses of the cluster.
const (
	LANPrefix   = "192.168.77."     // the LAN's /24
	LANIP       = LANPrefix + "1"   // the LAN namespace (API server)
	LANClientIP = LANPrefix + "200" // the LAN client namespace (not a node)
	// The LAN's IPv6 prefix (a /64 on the same bridge): the LAN namespace
	// has LANPrefix6+"1", the client LANPrefix6+"200", node i
	// LANPrefix6+(10+i). Only the LAN has IPv6: the cluster (pods,
	// Services, node InternalIPs) stays IPv4, unless Options.DualStack.
	LANPrefix6     = "fd77:77::"
	LANIP6         = LANPrefix6 + "1"
	LANClientIP6   = LANPrefix6 + "200"
	ClusterCIDR    = "10.244.0.0/16"
	ServiceCIDR    = "10.96.0.0/16"
	KubernetesSvc  = "10.96.0.1" // the `kubernetes` Service's ClusterIP
	nodeCIDRMask   = "24"
	firstNodeOctet = 10 // node i has LANPrefix + (10+i)
	// The IPv6 pod and Service ranges of a DualStack cluster (IPv4 stays
	// the primary family): node i's pod subnet is a /64 of ClusterCIDR6.
	ClusterCIDR6  = "fd00:10:244::/56"
	ServiceCIDR6  = "fd00:10:96::/112"
	nodeCIDRMask6 = "64"
)

// Options describe the cluster.
type Options struct {
	Nodes     int    // worker nodes at start (default 2)
	ProxyMode string // kube-proxy mode: "iptables" (default) or "nftables"
	Backend   string // BACKEND of the shipped DaemonSet: "host-gw", "vxlan", "auto" (default: the manifest's)
	// BridgeNFCall is net.bridge.bridge-nf-call-iptables and -ip6tables in
	// every node namespace: "1" (default; what kubeadm's prerequisites
	// ask for) or "0" (a plain distribution's default without
	// br_netfilter's sysctl set). Per network namespace, so the host's stay.
	BridgeNFCall string
	// ClusterDNS is the kubelets' clusterDNS address (empty: none; pods
	// get a resolv.conf naming nothing reachable).
	ClusterDNS string
	// MaxPods is the kubelets' maxPods (0: kubelet's default, 110). The
	// pod-start benchmark sets it above 110 so 110 of its pods fit beside
	// Village's DaemonSet pod.
	MaxPods int
	// Chart installs Village through its Helm chart (deploy/helm/village,
	// rendered with Helm's Go library by test/helm's village-chart, with
	// podCIDR ClusterCIDR and Backend) instead of applying
	// deploy/kubernetes.
	Chart bool
	// Release starts the cluster on a released version (LastRelease): its
	// deploy/kubernetes applied and its image imported beside the
	// checkout's (Images.Village, buildinfo.Image), which an upgrade then
	// applies.
	Release *Release
	// Audit makes the API server log every request's metadata (read with
	// API().AuditEvents): the benchmarks count a client's requests.
	Audit bool
	// DualStack makes the cluster IPv4/IPv6 dual-stack: ClusterCIDR and
	// ClusterCIDR6 on the controller-manager's --cluster-cidr (a pod
	// subnet per family in every Node's spec.podCIDRs), ServiceCIDR and
	// ServiceCIDR6 as --service-cluster-ip-range, each kubelet's --node-ip
	// its IP and IP6, kube-proxy's clusterCIDR both, and the DaemonSet's
	// CLUSTER_CIDR both (the shipped ConfigMap is applied as it is: its
	// IPAM block names no range, villaged publishes both of the Node's
	// podCIDRs, and isDefaultGateway routes both families). The harness
	// routes both families' pod subnets in the LAN namespace.
	DualStack bool
}

// ClusterCIDRs is the cluster's pod network as kube-controller-manager's
// --cluster-cidr and Village's clusterCIDR take it: ClusterCIDR, and with
// DualStack ClusterCIDR6 after it.
func (o Options) ClusterCIDRs() string {
	if o.DualStack {
		return ClusterCIDR + "," + ClusterCIDR6
	}
	return ClusterCIDR
}

// ServiceCIDRs is the --service-cluster-ip-range: ServiceCIDR, and with
// DualStack ServiceCIDR6 after it.
func (o Options) ServiceCIDRs() string {
	if o.DualStack {
		return ServiceCIDR + "," + ServiceCIDR6
	}
	return ServiceCIDR
}

// Cluster is a running cluster.
type Cluster struct {
	opts     Options
	t        testing.TB
	root     string // module root
	dir      string
	id       string // short random tag (cgroup roots)
	kubeDir  string
	lan      ns.NetNS
	client   ns.NetNS
	api      *kubetest.Server
	procs    []*testenv.Proc
	images   []string // archives every node imports (also nodes added later)
	Images   Images
	mu       sync.Mutex
	nodes    []*Node
	routes   map[string]string // podCIDR -> node IP, as set in the LAN namespace
	stopLoop chan struct{}
	loopDone chan struct{}
}

// Images are the OCI archives the cluster built and imported.
type Images struct {
	Village string // bin/village-image.tar's twin: mkimage over Village's built binaries
	Pause   string // crienv.PauseImage, the sandbox image
	Tools   string // crienv.ToolsImage: busybox applets and /pause (TCP answer, echo, hold)
}

// KubeDir is where the Kubernetes binaries are ($VILLAGE_KUBE_DIR, default
// the cache scripts/kube.sh fills).
func KubeDir() string {
	if d := os.Getenv("VILLAGE_KUBE_DIR"); d != "" {
		return d
	}
	return filepath.Join("/var/cache/village", "kubernetes-"+kubetest.Version)
}

var kubeBinaries = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// Start builds the images, starts the control plane and the nodes, applies
// deploy/kubernetes and waits until every node is Ready with Village's
// DaemonSet Ready on it. Any error fails the test; everything is torn down
// in t.Cleanup, also after a failed start.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	testenv.RequireRoot(t)
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.ProxyMode == "" {
		o.ProxyMode = "iptables"
	}
	if o.BridgeNFCall == "" {
		o.BridgeNFCall = "1"
	}
	c := &Cluster{opts: o, t: t, dir: t.TempDir(), id: randomID(t), kubeDir: KubeDir(), routes: map[string]string{}}
	for _, b := range kubeBinaries {
		if _, err := os.Stat(filepath.Join(c.kubeDir, b)); err != nil {
			t.Fatalf("kubecluster: %s not found in %s (%v): run scripts/kube.sh (it builds and caches the Kubernetes %s binaries; scripts/test.sh does) or set VILLAGE_KUBE_DIR", b, c.kubeDir, err, kubetest.Version)
		}
	}
	if os.Getenv("VILLAGE_KUBE_APISERVER") == "" {
		t.Setenv("VILLAGE_KUBE_APISERVER", filepath.Join(c.kubeDir, "kube-apiserver"))
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.root = root
	c.buildImages(t)
	c.startLAN(t)
	c.api = kubetest.Start(t, kubetest.Options{NetNS: c.lan, IP: LANIP, Audit: o.Audit, Args: []string{
		"--endpoint-reconciler-type=lease",
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--service-cluster-ip-range=" + o.ServiceCIDRs(),
	}})
	t.Cleanup(c.stopProcs)
	c.startControllers(t)
	c.stopLoop, c.loopDone = make(chan struct{}), make(chan struct{})
	go c.routeLoop()
	t.Cleanup(func() { close(c.stopLoop); <-c.loopDone })
	var wg sync.WaitGroup
	nodes := make([]*Node, o.Nodes)
	errs := make([]error, o.Nodes)
	for i := range o.Nodes {
		nodes[i] = c.newNode(t, i+1)
	}
	for i, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = n.start() }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
	}
	// Registered last, so it runs first: logs while everything still runs.
	t.Cleanup(c.dumpOnFailure)
	c.installVillage(t)
	if err := c.WaitVillageReady(5 * time.Minute); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	if err := c.waitServiceAccount("default", 2*time.Minute); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	return c
}

// Kubeconfig is the admin kubeconfig (system:masters). Its server is
// LANIP: use it only from inside LAN().
func (c *Cluster) Kubeconfig() string { return c.api.AdminKubeconfig }

// Client is an admin clientset whose connections are made inside the LAN
// namespace.
func (c *Cluster) Client() kubernetes.Interface { return c.api.Client }

// API is the kubetest server (its rest.Config dials inside the LAN).
func (c *Cluster) API() *kubetest.Server { return c.api }

// LAN is the control-plane namespace, the LAN bridge's owner.
func (c *Cluster) LAN() ns.NetNS { return c.lan }

// LANClient is a namespace on the LAN that is no node (LANClientIP,
// LANClientIP6 on its eth0).
func (c *Cluster) LANClient() ns.NetNS { return c.client }

// FreezeAPIServer stops the kube-apiserver process with SIGSTOP (its
// connections stay open and unanswered, as with a hung control plane) and
// returns the thaw (SIGCONT); the thaw also runs in t.Cleanup, so a
// failing test never leaves the API server frozen. Calling the thaw twice
// is harmless.
func (c *Cluster) FreezeAPIServer(t testing.TB) (thaw func()) {
	t.Helper()
	pid := c.api.APIServerPID()
	if pid == 0 {
		t.Fatal("kubecluster: no kube-apiserver process to freeze")
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(comm)) != "kube-apiserver" {
		t.Fatalf("kubecluster: process %d is %q, not kube-apiserver (%v)", pid, comm, err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("kubecluster: SIGCONT to kube-apiserver %d: %v", pid, err)
			}
		})
	}
	t.Cleanup(thaw)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("kubecluster: SIGSTOP to kube-apiserver %d: %v", pid, err)
	}
	return thaw
}

// Nodes are the cluster's nodes, in the order they joined.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Options are the options the cluster started with (defaults filled in).
func (c *Cluster) Options() Options { return c.opts }

// RunInLAN runs cmd inside the LAN namespace and waits for it.
func (c *Cluster) RunInLAN(cmd *exec.Cmd) error {
	if err := testenv.InNS(c.lan, cmd.Start); err != nil {
		return fmt.Errorf("starting %s in the LAN namespace: %w", cmd.Path, err)
	}
	return cmd.Wait()
}

// Kubectl runs kubectl with the admin kubeconfig inside the LAN namespace
// (bounded at two minutes) and returns its standard output; the error
// carries its standard error.
func (c *Cluster) Kubectl(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.kubeDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := c.RunInLAN(cmd); err != nil {
		return out.Bytes(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out.Bytes(), nil
}

// ImportImage imports an OCI archive into every node's containerd (CRI's
// k8s.io namespace), and into every node added later (from a copy the
// cluster keeps, so the caller may remove the archive).
func (c *Cluster) ImportImage(archive string) error {
	kept, err := os.CreateTemp(c.dir, "image-*.tar")
	if err != nil {
		return err
	}
	src, err := os.Open(archive)
	if err == nil {
		_, err = io.Copy(kept, src)
		src.Close()
	}
	if cerr := kept.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("keeping a copy of image archive %s: %w", archive, err)
	}
	archive = kept.Name()
	c.mu.Lock()
	c.images = append(c.images, archive)
	nodes := append([]*Node(nil), c.nodes...)
	c.mu.Unlock()
	for _, n := range nodes {
		if err := n.importImage(archive); err != nil {
			return err
		}
	}
	return nil
}

// AddNode starts one more node, joining the running cluster, and returns
// once it is Ready with Village's DaemonSet pod Ready on it.
func (c *Cluster) AddNode(t testing.TB) *Node {
	t.Helper()
	c.mu.Lock()
	idx := len(c.nodes) + 1
	c.mu.Unlock()
	n := c.newNode(t, idx)
	if err := n.start(); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	if err := c.WaitVillageReady(5 * time.Minute); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	return n
}

// WaitNodeReady waits until the Node object reports Ready.
func (c *Cluster) WaitNodeReady(name string, timeout time.Duration) error {
	return poll(timeout, func() error {
		n, err := c.Client().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s Ready=%s: %s", name, cond.Status, cond.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", name)
	})
}

func (c *Cluster) waitServiceAccount(namespace string, timeout time.Duration) error {
	return poll(timeout, func() error {
		_, err := c.Client().CoreV1().ServiceAccounts(namespace).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
}

// poll calls f until it returns nil or timeout passes (then f's last error).
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %w", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Poll is poll for the tests: f until nil, or its last error after timeout.
func Poll(timeout time.Duration, f func() error) error { return poll(timeout, f) }

// routeLoop keeps one route per Node podCIDR via the node's InternalIP of
// its family in the LAN namespace, so the API server (exec, logs go to the
// kubelet; a webhook or e2e.test to pods) and clients there reach pods.
func (c *Cluster) routeLoop() {
	defer close(c.loopDone)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		c.syncRoutes()
		select {
		case <-c.stopLoop:
			return
		case <-tick.C:
		}
	}
}

func (c *Cluster) syncRoutes() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, n := range nodes.Items {
		ips := map[bool]string{} // InternalIP by family (IPv6: true)
		for _, a := range n.Status.Addresses {
			if ip := net.ParseIP(a.Address); a.Type == corev1.NodeInternalIP && ip != nil {
				ips[ip.To4() == nil] = a.Address
			}
		}
		for _, cidr := range n.Spec.PodCIDRs {
			ip := ips[strings.Contains(cidr, ":")]
			if ip == "" || c.routes[cidr] == ip {
				continue
			}
			if _, err := testenv.IP(c.lan, "route", "replace", cidr, "via", ip); err == nil {
				c.routes[cidr] = ip
			}
		}
	}
}

// dumpOnFailure logs what a failing test needs: every node's kubelet,
// containerd and kube-proxy log tails, the agent pods' logs and events, the
// controller-manager's and scheduler's logs.
func (c *Cluster) dumpOnFailure() {
	if !c.t.Failed() {
		return
	}
	for _, n := range c.Nodes() {
		for _, name := range []string{"kubelet", "containerd", "kube-proxy", "supervisor"} {
			c.t.Logf("kubecluster: %s %s log (tail):\n%s", n.Name, name, tailFile(filepath.Join(n.dir, name+".log"), 6000))
		}
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		c.t.Logf("kubecluster: %s log (tail):\n%s", name, tailFile(filepath.Join(c.dir, name+".log"), 4000))
	}
	if out, err := c.Kubectl("-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=village", "--all-containers", "--prefix", "--tail=80"); err == nil {
		c.t.Logf("kubecluster: village pods' logs:\n%s", out)
	} else {
		c.t.Logf("kubecluster: village pods' logs: %v", err)
	}
	if out, err := c.Kubectl("get", "events", "-A", "--sort-by=.lastTimestamp"); err == nil {
		c.t.Logf("kubecluster: events:\n%s", tail(out, 8000))
	}
	if out, err := c.Kubectl("get", "pods", "-A", "-o", "wide"); err == nil {
		c.t.Logf("kubecluster: pods:\n%s", out)
	}
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tail(b, n)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// buildImages writes the pause and tools images (crienv.BuildImages) and
// Village's DaemonSet image through internal/ociimage/mkimage from the
// built binaries, the command `./build_linux.sh image` runs.
func (c *Cluster) buildImages(t testing.TB) {
	t.Helper()
	pause, tools, err := crienv.BuildImages(c.root, c.dir)
	if err != nil {
		t.Fatalf("kubecluster: test images: %v", err)
	}
	village := filepath.Join(c.dir, "village-image.tar")
	if err := BuildVillageImage(t, village, ""); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.Images = Images{Village: village, Pause: pause, Tools: tools}
	c.images = []string{pause, tools, village}
	if r := c.opts.Release; r != nil {
		c.images = append(c.images, r.Archive())
	}
}

// BuildVillageImage writes the DaemonSet image of Village's built binaries
// (testenv.Bins: $VILLAGE_BIN_DIR or a fresh build) to out, named name
// (empty: the shipped reference, buildinfo.Image), with the same command
// `./build_linux.sh image` runs.
func BuildVillageImage(t testing.TB, out, name string) error {
	root, err := testenv.ModuleRoot()
	if err != nil {
		return err
	}
	args := []string{"run", "-trimpath", "./internal/ociimage/mkimage", "-bin", testenv.Bins(t), "-ref", testenv.RefBins(t), "-o", out}
	if name != "" {
		args = append(args, "-name", name)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the DaemonSet image (go %s): %w: %s", strings.Join(args, " "), err, b)
	}
	return nil
}
