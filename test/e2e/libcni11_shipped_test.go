package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
)

// The shipped examples that need services (an etcd, a kube-apiserver, a
// running villaged) run here through libcni 1.1.2, the way containerd
// 1.6/1.7 runs them. Each runs on one namespace node whose underlay eth0
// carries 192.168.50.11/24 on a namespace LAN, with the service in a LAN
// host namespace at 192.168.50.5, the address the examples name. What the
// test changes in a file is only paths (ipam dataDir, the etcd TLS files,
// the kubeconfig); every other key is the shipped one.

const shippedServiceIP = "192.168.50.5"

// shippedNet is one example and what it needs.
type shippedNet struct {
	file string
	// store starts the example's service in host and returns the
	// example's text with the service's paths put in.
	store func(t *testing.T, host ns.NetNS, text string) string
	// lease: the example's subnet comes from villaged run.
	lease bool
	// want is the pod address range; want6, when set, the IPv6 one
	// (dual stack: a default route through the bridge for each family).
	want, want6 string
	// lanWant is set for the LAN example: the macvlan attachment's
	// address range (on net1), allocated in etcd.
	lanWant string
}

// etcdPaths starts a TLS etcd at the examples' address and puts its CA and
// client certificate where the example names /etc/village/etcd/*.
func etcdPaths(etcd **etcdtest.Server) func(t *testing.T, host ns.NetNS, text string) string {
	return func(t *testing.T, host ns.NetNS, text string) string {
		s := etcdtest.StartTLSIn(t, host, shippedServiceIP)
		*etcd = s
		return strings.NewReplacer(
			"/etc/village/etcd/ca.crt", s.TLS.CAFile,
			"/etc/village/etcd/client.crt", s.TLS.ClientCertFile,
			"/etc/village/etcd/client.key", s.TLS.ClientKeyFile,
		).Replace(text)
	}
}

// kubePaths starts a kube-apiserver at the examples' address with the
// shipped RBAC and Node node1 (podCIDR 10.244.1.0/24, as
// kube-controller-manager would give it) and puts the agent's kubeconfig
// where the example names /etc/village/kubeconfig.
func kubePaths(t *testing.T, host ns.NetNS, text string) string {
	return kubePathsFor(t, host, text, "10.244.1.0/24")
}

// kubePathsFor is kubePaths with the Node's pod subnets given.
func kubePathsFor(t *testing.T, host ns.NetNS, text string, podCIDRs ...string) string {
	kube := kubetest.Start(t, kubetest.Options{NetNS: host, IP: shippedServiceIP})
	applyRBAC(t, kube)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"},
		Spec: corev1.NodeSpec{PodCIDR: podCIDRs[0], PodCIDRs: podCIDRs}}
	_, err := kube.Client.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{})
	must(t, err, "creating Node node1")
	return replaceOnce(t, text, "/etc/village/kubeconfig", kube.AgentKubeconfig)
}

// replaceOnce replaces the one old in text, failing when text has none (a
// path the test means to move must be there).
func replaceOnce(t *testing.T, text, old, new string) string {
	t.Helper()
	if strings.Count(text, old) != 1 {
		t.Fatalf("want exactly one %q in:\n%s", old, text)
	}
	return strings.Replace(text, old, new, 1)
}

// withIPAMDir sets dataDir in every village-ipam block of text, whatever
// follows its type.
func withIPAMDir(text, dir string) string {
	return strings.ReplaceAll(text, `"type": "village-ipam"`, fmt.Sprintf(`"type": "village-ipam", "dataDir": %q`, dir))
}

// etcdAllocation returns the etcd store's allocation keys under /village
// of ip or of container id (ips/IP, owners/ID/...); the range's
// last-reserved pointer (last/N) is not an allocation and stays.
func etcdAllocation(t *testing.T, cli *clientv3.Client, ip, id string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/village", clientv3.WithPrefix())
	must(t, err, "reading /village from etcd")
	var out []string
	for _, kv := range resp.Kvs {
		if k := string(kv.Key); strings.HasSuffix(k, "/ips/"+ip) || strings.Contains(k, "/owners/"+id+"/") {
			out = append(out, string(kv.Key))
		}
	}
	return out
}

func inRange(t *testing.T, r *current.Result, ifName, cidr string) *current.IPConfig {
	t.Helper()
	_, want, err := net.ParseCIDR(cidr)
	must(t, err, "parse %s", cidr)
	for _, ipc := range r.IPs {
		if ipc.Interface != nil && r.Interfaces[*ipc.Interface].Name == ifName && want.Contains(ipc.Address.IP) {
			return ipc
		}
	}
	t.Fatalf("no address of %s in %s in the result %+v", ifName, cidr, r)
	return nil
}

// TestShippedServiceConfsUnderLibcni11 runs conf/20-village-lan.conflist
// (etcd-backed macvlan pool), 40-village-registry.conflist (etcd registry,
// villaged leases the subnet) and 41-village-kubernetes.conflist
// (Kubernetes registry, villaged reads the Node's podCIDR) through libcni
// 1.1.2: ADD gives the pod an address in the expected range and it pings
// its gateway, CHECK passes, DEL (twice) releases what ADD held.
func TestShippedServiceConfsUnderLibcni11(t *testing.T) {
	var etcd *etcdtest.Server
	nets := []shippedNet{
		{file: "20-village-lan.conflist", store: etcdPaths(&etcd), want: "10.244.1.0/24", lanWant: "192.168.50.200/27"},
		{file: "40-village-registry.conflist", store: etcdPaths(&etcd), lease: true, want: "10.244.0.0/16"},
		{file: "41-village-kubernetes.conflist", store: kubePaths, lease: true, want: "10.244.1.0/24"},
	}
	for _, e := range nets {
		t.Run(e.file, func(t *testing.T) {
			etcd = nil
			n, host := shippedNode(t)
			b, err := os.ReadFile(filepath.Join(confDir(t), e.file))
			must(t, err, "read %s", e.file)
			text := e.store(t, host, withIPAMDir(string(b), filepath.Join(n.Dir, "ipam")))
			conf := filepath.Join(n.Dir, e.file)
			must(t, os.WriteFile(conf, []byte(text), 0o600), "write %s", conf)
			e.addCheckDel(t, n, host, conf, etcd)
		})
	}
}

// shippedNode is a node with eth0 192.168.50.11/24 (default route via
// .1) on a LAN whose host namespace has 192.168.50.5.
func shippedNode(t *testing.T) (*Node, ns.NetNS) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", shippedServiceIP+"/24")
	n := NewNode(t)
	lan.Attach(t, n.NS, "eth0", "192.168.50.11/24")
	testenv.MustIP(t, n.NS, "route", "add", "default", "via", "192.168.50.1")
	return n, host
}

// addCheckDel runs conf on n through libcni 1.1.2 (after villaged leased
// the subnet, when e.lease): one pod's ADD, its addresses and gateway,
// CHECK, DEL twice and nothing left (etcd's allocation too, when etcd
// holds the LAN pool).
func (e shippedNet) addCheckDel(t *testing.T, n *Node, host ns.NetNS, conf string, etcd *etcdtest.Server) {
	t.Helper()
	runDir := filepath.Join(n.Dir, "run")
	// village-ipam (run by libcni 1.1.2, which passes its environment
	// on) reads the lease from villaged's run dir.
	t.Setenv("VILLAGE_RUN_DIR", runDir)
	leased := ""
	if e.lease {
		log, _ := runVillaged(t, n, conf, "node1", "200ms")
		waitFor(t, 60*time.Second, "villaged leases the subnet", func() (bool, string) {
			b, err := os.ReadFile(filepath.Join(runDir, "village", "subnet"))
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasSuffix(line, "/24") && !strings.HasPrefix(line, "#") {
					leased = line
				}
			}
			return err == nil && leased != "", log.String()
		})
	}
	o := &oldRuntime{n: n, conf: conf, cache: filepath.Join(n.Dir, "cache-1.1")}
	p := n.NewPod()
	out, err := o.run(t, "add", p)
	must(t, err, "ADD through libcni 1.1.2")
	r := &current.Result{}
	must(t, json.Unmarshal([]byte(out), r), "decode libcni 1.1.2's result %s", out)
	pod := inRange(t, r, "eth0", e.want)
	if leased != "" {
		inRange(t, r, "eth0", leased) // the subnet villaged leased
	}
	addrs := []*current.IPConfig{pod}
	if e.want6 != "" {
		addrs = append(addrs, inRange(t, r, "eth0", e.want6))
	}
	for _, a := range addrs {
		if a.Gateway == nil {
			t.Fatalf("no gateway for %s: %s", a.Address.String(), out)
		}
		must(t, testenv.Ping(p.NS, a.Gateway.String(), 2), "pod %s -> its gateway %s", a.Address.String(), a.Gateway)
		if e.want6 == "" {
			continue
		}
		// Dual stack: a default route through the bridge per family.
		fam := "-4"
		if a.Address.IP.To4() == nil {
			fam = "-6"
		}
		if got := testenv.MustIP(t, p.NS, fam, "route", "show", "default"); !strings.Contains(got, "default via "+a.Gateway.String()+" dev eth0") {
			t.Fatalf("pod's %s default route %q, want one via %s on eth0", fam, got, a.Gateway)
		}
	}
	var lanIP string
	if e.lanWant != "" {
		l := inRange(t, r, "net1", e.lanWant)
		lanIP = l.Address.IP.String()
		// The LAN address answers from the LAN host.
		must(t, testenv.Ping(host, lanIP, 2), "LAN host -> pod's macvlan %s", lanIP)
	}
	_, err = o.run(t, "check", p)
	must(t, err, "CHECK through libcni 1.1.2")
	var cli *clientv3.Client
	if lanIP != "" {
		cli = etcd.ClientIn(t, host)
		if k := etcdAllocation(t, cli, lanIP, p.ID); len(k) == 0 {
			t.Fatalf("before DEL: no etcd allocation of the LAN address %s", lanIP)
		}
	}
	nothingLeft(t, n, o.cache, held{attachments: true, cached: true}, func() {
		for range 2 {
			_, err := o.run(t, "del", p)
			must(t, err, "DEL through libcni 1.1.2")
		}
	})
	if cli != nil {
		if k := etcdAllocation(t, cli, lanIP, p.ID); len(k) != 0 {
			t.Fatalf("after DEL: etcd still holds the LAN address %s: %v", lanIP, k)
		}
	}
}

// installed runs the real `villaged install` inside n with template tmpl
// ("" for the built-in one) into directories under n.Dir, and returns the
// conflist it wrote.
func installed(t *testing.T, n *Node, tmpl string) string {
	t.Helper()
	args := []string{"install", "--cni-bin-dir", filepath.Join(n.Dir, "opt-cni-bin"), "--cni-conf-dir", filepath.Join(n.Dir, "net.d"),
		"--state-dir", filepath.Join(n.Dir, "state"), "--bin-source", testenv.Bins(t), "--node-name", "node1"}
	if tmpl != "" {
		args = append(args, "--conf", tmpl)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name(), filepath.Join(testenv.Bins(t), "villaged")}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("villaged install: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(n.Dir, "net.d", "10-village.conflist"))
	must(t, err, "reading the installed conflist")
	return string(b)
}

// configMapTemplate is the conflist template of
// deploy/kubernetes/configmap.yaml, written to a file under dir.
func configMapTemplate(t *testing.T, dir string) string {
	root, err := testenv.ModuleRoot()
	must(t, err, "module root")
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "configmap.yaml"))
	must(t, err, "reading configmap.yaml")
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	must(t, err, "decoding configmap.yaml")
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("configmap.yaml holds a %T", obj)
	}
	tmpl, ok := cm.Data["10-village.conflist.tmpl"]
	if !ok {
		t.Fatalf("configmap.yaml has no 10-village.conflist.tmpl: %v", cm.Data)
	}
	p := filepath.Join(dir, "10-village.conflist.tmpl")
	must(t, os.WriteFile(p, []byte(tmpl), 0o600), "write %s", p)
	return p
}

// TestInstalledConfsUnderLibcni11 renders the built-in `villaged install`
// template and the DaemonSet's ConfigMap template with the real villaged
// install on a node, and runs what it wrote through libcni 1.1.2. The
// built-in one is a single-node bridge (10.244.1.0/24 by default); the
// ConfigMap's takes the subnet from the Node's podCIDR through villaged run
// against a kube-apiserver, once single-stack and once with a pod subnet
// per family (CLUSTER_CIDR both, the ConfigMap as shipped: the pod must
// get a default route per family). Changed after rendering, paths only: the IPAM
// dataDir, the log file, and the ConfigMap's empty kubeconfig (in-cluster
// in the DaemonSet) becomes the agent's kubeconfig file.
func TestInstalledConfsUnderLibcni11(t *testing.T) {
	t.Run("built-in template", func(t *testing.T) {
		n, host := shippedNode(t)
		text := withIPAMDir(installed(t, n, ""), filepath.Join(n.Dir, "ipam"))
		conf := filepath.Join(n.Dir, "10-village.conflist")
		must(t, os.WriteFile(conf, []byte(text), 0o600), "write %s", conf)
		shippedNet{want: "10.244.1.0/24"}.addCheckDel(t, n, host, conf, nil)
	})
	// Dual stack: the same ConfigMap, a Node with a pod subnet per family
	// and CLUSTER_CIDR with both: nothing else to edit.
	for _, tc := range []struct {
		name, clusterCIDR string // clusterCIDR "": the template's default
		podCIDRs          []string
		net               shippedNet
	}{
		{"configmap.yaml", "", []string{"10.244.1.0/24"}, shippedNet{lease: true, want: "10.244.1.0/24"}},
		{"configmap.yaml dual stack", "10.244.0.0/16,fd00:10:244::/56", []string{"10.244.1.0/24", "fd00:10:244:1::/64"},
			shippedNet{lease: true, want: "10.244.1.0/24", want6: "fd00:10:244:1::/64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, host := shippedNode(t)
			if tc.clusterCIDR != "" {
				t.Setenv("CLUSTER_CIDR", tc.clusterCIDR)
			}
			text := installed(t, n, configMapTemplate(t, n.Dir))
			text = withIPAMDir(text, filepath.Join(n.Dir, "ipam"))
			text = replaceOnce(t, text, "/var/log/village/cni.log", filepath.Join(n.Dir, "cni.log"))
			text = replaceOnce(t, text, `"kubeconfig": ""`, `"kubeconfig": "/etc/village/kubeconfig"`)
			text = kubePathsFor(t, host, text, tc.podCIDRs...)
			conf := filepath.Join(n.Dir, "10-village.conflist")
			must(t, os.WriteFile(conf, []byte(text), 0o600), "write %s", conf)
			tc.net.addCheckDel(t, n, host, conf, nil)
		})
	}
}
