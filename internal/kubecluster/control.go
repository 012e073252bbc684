package kubecluster

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

func randomID(t testing.TB) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// startLAN makes the LAN namespace with its bridge and the LAN client
// namespace on it.
func (c *Cluster) startLAN(t testing.TB) {
	t.Helper()
	c.lan = testenv.NewNS(t)
	c.client = testenv.NewNS(t)
	for _, args := range [][]string{
		{"link", "add", "lan0", "type", "bridge"},
		{"addr", "add", LANIP + "/24", "dev", "lan0"},
		{"addr", "add", LANIP6 + "/64", "dev", "lan0", "nodad"},
		{"link", "set", "lan0", "up"},
	} {
		testenv.MustIP(t, c.lan, args...)
	}
	if err := c.plug("client", c.client.Path(), LANClientIP, LANClientIP6); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
}

// plug connects the namespace at nsPath to the LAN bridge: eth0 there with
// ip/24, ip6/64 (no duplicate detection, usable at once) and an IPv4
// default route via the LAN namespace (with DualStack an IPv6 one too, as
// a dual-stack node has: the node's own connections to an IPv6 ClusterIP
// need a route before kube-proxy's DNAT), port on lan0 here.
func (c *Cluster) plug(port, nsPath, ip, ip6 string) error {
	name := filepath.Base(nsPath)
	steps := [][]string{
		{"-n", filepath.Base(c.lan.Path()), "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"-n", filepath.Base(c.lan.Path()), "link", "set", port, "master", "lan0", "up"},
		{"-n", name, "addr", "add", ip + "/24", "dev", "eth0"},
		{"-n", name, "addr", "add", ip6 + "/64", "dev", "eth0", "nodad"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "route", "add", "default", "via", LANIP},
	}
	if c.opts.DualStack {
		steps = append(steps, []string{"-n", name, "-6", "route", "add", "default", "via", LANIP6})
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return fmt.Errorf("plugging %s into the LAN (ip %v): %w: %s", name, s, err, out)
		}
	}
	return nil
}

// startControllers starts kube-controller-manager (allocating podCIDRs,
// signing service-account tokens, publishing kube-root-ca.crt) and
// kube-scheduler in the LAN namespace.
func (c *Cluster) startControllers(t testing.TB) {
	t.Helper()
	kc := c.Kubeconfig()
	lan := filepath.Base(c.lan.Path())
	cm := []string{"ip", "netns", "exec", lan, filepath.Join(c.kubeDir, "kube-controller-manager"),
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--leader-elect=false", "--bind-address=127.0.0.1",
		"--allocate-node-cidrs", "--cluster-cidr=" + c.opts.ClusterCIDRs(),
		"--service-cluster-ip-range=" + c.opts.ServiceCIDRs(),
		"--service-account-private-key-file=" + c.api.SAKeyFile, "--root-ca-file=" + c.api.CAFile,
		"--use-service-account-credentials=false", "--controllers=*", "--v=1"}
	if c.opts.DualStack {
		cm = append(cm, "--node-cidr-mask-size-ipv4="+nodeCIDRMask, "--node-cidr-mask-size-ipv6="+nodeCIDRMask6)
	} else {
		cm = append(cm, "--node-cidr-mask-size="+nodeCIDRMask)
	}
	sched := []string{"ip", "netns", "exec", lan, filepath.Join(c.kubeDir, "kube-scheduler"),
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"}
	for name, argv := range map[string][]string{"kube-controller-manager": cm, "kube-scheduler": sched} {
		p, err := testenv.Spawn(name, filepath.Join(c.dir, name+".log"), true, argv...)
		if err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
		c.mu.Lock()
		c.procs = append(c.procs, p)
		c.mu.Unlock()
	}
}

// stopProcs stops the nodes (last joined first) and then the controllers.
func (c *Cluster) stopProcs() {
	nodes := c.Nodes()
	for i := len(nodes) - 1; i >= 0; i-- {
		nodes[i].stop()
	}
	for _, p := range c.procs {
		p.Stop()
	}
}
