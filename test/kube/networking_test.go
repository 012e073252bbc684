package kube_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/pkg/buildinfo"
)

// TestHostGWIptables: host-gw routes, kube-proxy in iptables mode, the
// networking checks, a minute with the API server frozen, the agent's
// least privilege, and then the lifecycle of the DaemonSet and the nodes.
func TestHostGWIptables(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Backend: "host-gw", ProxyMode: "iptables"})
	checkNetworking(t, c)
	t.Run("APIServerFrozen", func(t *testing.T) { checkAPIServerFrozen(t, c) }) // outage_test.go
	t.Run("LeastPrivilege", func(t *testing.T) { checkLeastPrivilege(t, c) })   // leastpriv_test.go
	t.Run("Lifecycle", func(t *testing.T) { checkLifecycle(t, c) })
}

// TestVXLANNftables: the VXLAN overlay, kube-proxy in nftables mode, Village
// installed through its Helm chart (rendered with Helm's library); then
// LoadBalancer Services on the LAN (issue 39, lanServices) in nftables mode.
func TestVXLANNftables(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Backend: "vxlan", ProxyMode: "nftables", Chart: true})
	checkNetworking(t, c)
	// Last: it installs the home-lab LAN config with macvlan.services.
	t.Run("LANServices", func(t *testing.T) { lanServices(t, c) })
}

// TestAutoNoBridgeNF: the auto backend on nodes whose
// net.bridge.bridge-nf-call-iptables is 0 (a distribution's default before
// kubeadm's prerequisites): Village must still pass its bridge's traffic
// to netfilter, so same-node ClusterIP works (issue 20, fault 1).
func TestAutoNoBridgeNF(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Backend: "auto", ProxyMode: "iptables", BridgeNFCall: "0"})
	checkNetworking(t, c)
}

// checkNetworking is every networking assertion on a two-node cluster.
func checkNetworking(t *testing.T, c *kubecluster.Cluster) {
	f := newFixture(t, c, "net")
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")
	f.server("s1", n1.Name)
	f.server("s2", n2.Name)
	f.server("c1", n1.Name)
	svcS1 := f.service("svc-s1", "s1", corev1.ServiceTypeClusterIP)
	svcS2 := f.service("svc-s2", "s2", corev1.ServiceTypeClusterIP)
	svcC1 := f.service("svc-c1", "c1", corev1.ServiceTypeClusterIP)
	np := f.service("np-s2", "s2", corev1.ServiceTypeNodePort)
	pods := f.running("s1", "s2", "c1")
	ip := func(name string) string { return pods[name].Status.PodIP }

	t.Run("DaemonSetReady", func(t *testing.T) {
		byNode := villagePods(t, c)
		for _, n := range c.Nodes() {
			p, ok := byNode[n.Name]
			if !ok {
				t.Fatalf("no Village pod on %s", n.Name)
			}
			if !podReady(&p) {
				t.Errorf("Village pod %s on %s not Ready: %v", p.Name, n.Name, p.Status.Conditions)
			}
			// The conflist the init container rendered names the backend.
			if want := c.Options().Backend; want != "" {
				conf, err := n.Exec("cat", "/etc/cni/net.d/10-village.conflist")
				if err != nil || !strings.Contains(string(conf), `"type": "`+want+`"`) {
					t.Errorf("%s's conflist does not name backend %q (%v):\n%s", n.Name, want, err, conf)
				}
			}
			for _, ct := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				if ct.Image != buildinfo.Image {
					t.Errorf("Village pod %s container %s runs %s, not the shipped %s", p.Name, ct.Name, ct.Image, buildinfo.Image)
				}
			}
		}
	})
	t.Run("PodAddresses", func(t *testing.T) {
		_, cluster, _ := net.ParseCIDR(kubecluster.ClusterCIDR)
		seen := map[string]string{}
		for name, p := range pods {
			addr := net.ParseIP(p.Status.PodIP)
			if !cluster.Contains(addr) {
				t.Errorf("pod %s has %s, outside the cluster CIDR %s", name, addr, kubecluster.ClusterCIDR)
			}
			nd, err := c.Client().CoreV1().Nodes().Get(context.Background(), p.Spec.NodeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_, sub, err := net.ParseCIDR(nd.Spec.PodCIDR)
			if err != nil || !sub.Contains(addr) {
				t.Errorf("pod %s on %s has %s, outside the node's podCIDR %q (%v)", name, p.Spec.NodeName, addr, nd.Spec.PodCIDR, err)
			}
			if other, dup := seen[p.Status.PodIP]; dup {
				t.Errorf("pods %s and %s share %s", name, other, addr)
			}
			seen[p.Status.PodIP] = name
			out, err := f.exec(name, "ip", "-4", "addr", "show", "eth0")
			if err != nil || !strings.Contains(out, p.Status.PodIP+"/") {
				t.Errorf("pod %s's eth0 does not hold %s: %v\n%s", name, addr, err, out)
			}
		}
	})
	t.Run("PodMTU", func(t *testing.T) {
		// Both nodes share one LAN and the pods are IPv4 only: host-gw and
		// auto (the manifest's default) route every peer plainly, so there is
		// no village.1 and pods get the underlay's MTU; vxlan gives it less 50.
		vxlan := c.Options().Backend == "vxlan"
		for name, p := range pods {
			nd := node(t, c, p.Spec.NodeName)
			under, err := nd.Exec("ip", "-o", "link", "show", "eth0")
			mtu := linkMTU(string(under))
			if err != nil || mtu == 0 {
				t.Fatalf("%s's underlay MTU: %v: %s", nd.Name, err, under)
			}
			if vxlan {
				mtu -= 50
			}
			out, err := f.exec(name, "ip", "-o", "link", "show", "eth0")
			if got := linkMTU(out); err != nil || got != mtu {
				t.Errorf("pod %s on %s: eth0 MTU %d (%v), want %d: %s", name, nd.Name, got, err, mtu, out)
			}
			dev, err := nd.Exec("ip", "-o", "link", "show", "village.1")
			if (err == nil) != vxlan {
				t.Errorf("%s with backend %q: village.1 present %v, want %v: %s", nd.Name, c.Options().Backend, err == nil, vxlan, dev)
			}
		}
	})
	t.Run("SameNodePodToPod", func(t *testing.T) {
		expect(t, "c1 -> s1 (node-1)", "s1", f.tcpFromPod("c1", ip("s1"), 8080))
	})
	t.Run("CrossNodePodToPod", func(t *testing.T) {
		expect(t, "c1 (node-1) -> s2 (node-2)", "s2", f.tcpFromPod("c1", ip("s2"), 8080))
		expect(t, "s2 (node-2) -> c1 (node-1)", "c1", f.tcpFromPod("s2", ip("c1"), 8080))
	})
	t.Run("ClusterIPSameNode", func(t *testing.T) {
		expect(t, "c1 -> svc-s1 (endpoint on the same node)", "s1", f.tcpFromPod("c1", svcS1.Spec.ClusterIP, 80))
	})
	t.Run("ClusterIPOtherNode", func(t *testing.T) {
		expect(t, "c1 -> svc-s2 (endpoint on the other node)", "s2", f.tcpFromPod("c1", svcS2.Spec.ClusterIP, 80))
	})
	t.Run("Hairpin", func(t *testing.T) {
		expect(t, "c1 -> svc-c1 (selects c1 itself)", "c1", f.tcpFromPod("c1", svcC1.Spec.ClusterIP, 80))
	})
	t.Run("NodePortFromLAN", func(t *testing.T) {
		port := strconv.Itoa(int(np.Spec.Ports[0].NodePort))
		for _, n := range []*kubecluster.Node{n1, n2} {
			expect(t, "LAN client -> "+n.Name+":"+port, "s2", dialIn(c.LANClient(), net.JoinHostPort(n.IP, port)))
		}
	})
	t.Run("NodeToClusterIP", func(t *testing.T) {
		expect(t, "node-2 -> svc-s1", "s1", dialIn(n2.NetNS, net.JoinHostPort(svcS1.Spec.ClusterIP, "80")))
	})
	t.Run("KubernetesService", func(t *testing.T) {
		// Plain HTTP to the API server's TLS port: Go's TLS server answers
		// it with a 400 naming HTTPS, proof the Service reached it.
		err := kubecluster.Poll(wait, func() error {
			out, err := f.exec("c1", "sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 "+kubecluster.KubernetesSvc+" 443")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "HTTPS server") {
				return fmt.Errorf("answer %q", out)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("c1 -> kubernetes Service %s:443: %v", kubecluster.KubernetesSvc, err)
		}
	})
	t.Run("EgressMasquerade", func(t *testing.T) {
		sourceServer(t, c.LAN(), net.JoinHostPort(kubecluster.LANIP, "9099"))
		expect(t, "c1 -> the LAN namespace: the source it sees", n1.IP, f.tcpFromPod("c1", kubecluster.LANIP, 9099))
	})
	t.Run("DeleteReleasesAddress", func(t *testing.T) {
		f.server("gone", n1.Name)
		p := f.running("gone")["gone"]
		addr := p.Status.PodIP
		if held, err := ipamHolds(n1, addr); err != nil || !held {
			t.Fatalf("node-1's IPAM store does not hold %s of running pod gone (%v)", addr, err)
		}
		if err := c.Client().CoreV1().Pods(f.ns).Delete(context.Background(), "gone", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err := kubecluster.Poll(wait, func() error {
			if _, err := c.Client().CoreV1().Pods(f.ns).Get(context.Background(), "gone", metav1.GetOptions{}); err == nil {
				return fmt.Errorf("pod gone still exists")
			}
			held, err := ipamHolds(n1, addr)
			if err != nil {
				return err
			}
			if held {
				return fmt.Errorf("%s still allocated", addr)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("deleting pod gone did not release %s: %v", addr, err)
		}
	})
}

// linkMTU is the MTU in a line of `ip -o link show`, 0 when there is none.
func linkMTU(line string) int {
	f := strings.Fields(line)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "mtu" {
			n, _ := strconv.Atoi(f[i+1])
			return n
		}
	}
	return 0
}
