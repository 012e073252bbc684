package kube_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/macvlan"
)

// The DHCP server of TestLANDHCPPods: its pool, and the address it reserves
// for the test pod's stable MAC (outside TestLANPods' pool, the nodes and
// the LAN client).
const (
	dhcpFirst    = kubecluster.LANPrefix + "140"
	dhcpLast     = kubecluster.LANPrefix + "160"
	dhcpReserved = kubecluster.LANPrefix + "150"
	// dhcpT1 is the renewal time the server hands out (option 58), so a
	// renewal comes within the test (dnsmasq's shortest lease is 2 min).
	dhcpT1 = 5
)

// TestLANDHCPPods: LAN pods addressed by the LAN's own DHCP server, on the
// shipped DaemonSet with deploy/kubernetes/examples/homelab's DHCP variant
// (configmap-lan-dhcp.yaml, and daemonset-dhcp.yaml applied with kubectl
// patch): dnsmasq in the LAN namespace reserves an address for the stable
// MAC of pod lan-dhcp/dhcp-a; the pod, annotated village.cni.io/lan, gets
// that address on net1 and in its lan-address annotation, the LAN client
// reaches it by ping and TCP, villaged renews the lease (seen on the
// server, without a new DISCOVER), deleting the pod releases the lease
// (DHCPRELEASE, gone from the server's lease file), and the pod made again
// on the other node gets the same address.
func TestLANDHCPPods(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	const ns, pod = "lan-dhcp", "dhcp-a"
	mac := macvlan.StableMAC("village", ns, pod).String()
	srv := startDNSMasq(t, c, mac)
	installDHCPConfig(t, c)
	f := newFixture(t, c, ns)
	labelNS(t, c, ns, kubenames.LabelLANAllowed)
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")

	dhcpPod := func(nodeName string) {
		p := podSpec(pod, nodeName, corev1.RestartPolicyAlways, "-listen", ":8080", "-reply", pod)
		p.Annotations = map[string]string{kubenames.AnnotationLAN: "true"}
		f.create(p)
		f.running(pod)
	}
	reserved := func(where string) {
		t.Helper()
		if v := lanAddress(t, f, pod); v != "net1="+dhcpReserved+"/24" {
			t.Fatalf("%s: lan-address %q, want net1=%s/24 (the server's reservation for %s)", where, v, dhcpReserved, mac)
		}
		out, err := f.exec(pod, "ip", "-o", "link", "show", "dev", "net1")
		if err != nil || !strings.Contains(out, mac) {
			t.Fatalf("%s: net1 %q (%v), want MAC %s", where, out, err, mac)
		}
		out, err = f.exec(pod, "ip", "-o", "addr", "show", "dev", "net1")
		if err != nil || !strings.Contains(out, dhcpReserved+"/24") {
			t.Fatalf("%s: net1 addresses %q (%v), want %s/24", where, out, err, dhcpReserved)
		}
		must(t, testenv.Ping(c.LANClient(), dhcpReserved, 5), "%s: LAN client -> %s", where, dhcpReserved)
		expect(t, where+": LAN client -> the pod's leased address by TCP", pod, dialIn(c.LANClient(), dhcpReserved+":8080"))
	}

	dhcpPod(n1.Name)
	reserved("on node-1")
	// The server granted it to the pod's MAC, with its name as host name.
	if !srv.leased(mac, pod) {
		t.Fatalf("dnsmasq's lease file has no lease of %s for %s:\n%s", mac, pod, srv.leaseFile())
	}
	acks := srv.count("DHCPACK", mac)
	srv.waitCount(t, "DHCPACK", mac, acks+1, "the server acknowledging a renewal")
	if d := testenv.DiscoversAfterAck(srv.logText(), "lan0", mac); d != 0 {
		t.Fatalf("%d DISCOVERs from %s after the first ACK: a renewal must not start over\n%s", d, mac, srv.logText())
	}

	// Deleting the pod releases its lease.
	deletePod(t, f, pod)
	srv.waitCount(t, "DHCPRELEASE", mac, 1, "the server seeing the DHCPRELEASE of the deleted pod")
	if err := kubecluster.Poll(wait, func() error {
		if srv.leased(mac, "") {
			return fmt.Errorf("dnsmasq still holds a lease for %s", mac)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v:\n%s", err, srv.leaseFile())
	}

	// The same pod on the other node: the same MAC, so the same address.
	dhcpPod(n2.Name)
	reserved("on node-2")
	deletePod(t, f, pod)
	srv.waitCount(t, "DHCPRELEASE", mac, 2, "the server seeing the second DHCPRELEASE")
}

// dnsmasq is Debian's dnsmasq serving DHCP on the LAN bridge of the
// cluster's LAN namespace, with one reservation.
type dnsmasq struct {
	log, leases string
}

func startDNSMasq(t *testing.T, c *kubecluster.Cluster, mac string) *dnsmasq {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/dnsmasq"); err != nil {
			t.Fatalf("dnsmasq is needed (scripts/deps.sh installs dnsmasq-base): %v", err)
		}
	}
	dir := t.TempDir()
	d := &dnsmasq{log: filepath.Join(dir, "dnsmasq.log"), leases: filepath.Join(dir, "leases")}
	logf, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--no-daemon", "--conf-file=/dev/null", "--port=0", "--user=root", "--pid-file=",
		"--interface=lan0", "--bind-interfaces", "--log-dhcp", "--log-facility=-", "--dhcp-authoritative",
		"--dhcp-leasefile="+d.leases,
		"--dhcp-range="+dhcpFirst+","+dhcpLast+",255.255.255.0,2m",
		"--dhcp-host="+mac+","+dhcpReserved,
		fmt.Sprintf("--dhcp-option=58,%d", dhcpT1))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := testenv.InNS(c.LAN(), cmd.Start); err != nil {
		t.Fatalf("starting dnsmasq in the LAN namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			t.Logf("dnsmasq log:\n%s", d.logText())
		}
	})
	if err := kubecluster.Poll(wait, func() error {
		if !strings.Contains(d.logText(), "DHCP, IP range") {
			return fmt.Errorf("dnsmasq not serving DHCP yet: %s", d.logText())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *dnsmasq) logText() string {
	b, _ := os.ReadFile(d.log)
	return string(b)
}

func (d *dnsmasq) leaseFile() string {
	b, _ := os.ReadFile(d.leases)
	return string(b)
}

// leased reports whether the lease file holds a lease for mac at the
// reserved address (with host name host, when set).
func (d *dnsmasq) leased(mac, host string) bool {
	for _, line := range strings.Split(d.leaseFile(), "\n") {
		// <expiry> <MAC> <address> <host name> <client id>
		f := strings.Fields(line)
		if len(f) >= 4 && f[1] == mac && f[2] == dhcpReserved && (host == "" || f[3] == host) {
			return true
		}
	}
	return false
}

// count is how many lines of the server's log show msg (DHCPDISCOVER,
// DHCPACK, DHCPRELEASE, ...) for mac.
func (d *dnsmasq) count(msg, mac string) int {
	n := 0
	for _, line := range strings.Split(d.logText(), "\n") {
		if strings.Contains(line, " "+msg+"(lan0) ") && strings.Contains(line, " "+mac) {
			n++
		}
	}
	return n
}

func (d *dnsmasq) waitCount(t *testing.T, msg, mac string, atLeast int, why string) {
	t.Helper()
	if err := kubecluster.Poll(wait, func() error {
		if n := d.count(msg, mac); n < atLeast {
			return fmt.Errorf("%d %s for %s, want %d", n, msg, mac, atLeast)
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: %v\n%s", why, err, d.logText())
	}
}

// installDHCPConfig applies the home-lab DHCP variant: its ConfigMap with
// the cluster's LAN in place of the example's, and its DaemonSet patch as
// the example says (kubectl patch --patch-file, which rolls the agents);
// then waits until every node runs the patched agent on the new conflist.
func installDHCPConfig(t *testing.T, c *kubecluster.Cluster) {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	applyHomeLab(t, c, homeLab{
		file: "configmap-lan-dhcp.yaml",
		replace: [][2]string{
			{`"subnet": "192.168.50.0/24"`, `"subnet": "` + kubecluster.LANPrefix + `0/24"`},
			{`"rangeStart": "192.168.50.100"`, `"rangeStart": "` + dhcpFirst + `"`},
			{`"rangeEnd": "192.168.50.199"`, `"rangeEnd": "` + dhcpLast + `"`},
		},
		then: []string{"-n", kubecluster.VillageNamespace, "patch", "daemonset", kubecluster.VillageDaemonSet,
			"--patch-file", filepath.Join(root, "deploy", "kubernetes", "examples", "homelab", "daemonset-dhcp.yaml")},
		ready: func(n *kubecluster.Node) error {
			out, err := n.Exec("cat", "/etc/cni/net.d/10-village.conflist")
			if err != nil || !strings.Contains(string(out), `"dhcp"`) {
				return fmt.Errorf("conflist on %s without the DHCP LAN section (%v)", n.Name, err)
			}
			// The conflist is the new agent's (its install ran first), and
			// the old agent unlinked its socket on the way out: a socket is
			// the new agent serving DHCP on it.
			if _, err := n.Exec("test", "-S", "/run/village/agent.sock"); err != nil {
				return fmt.Errorf("no agent socket on %s: %w", n.Name, err)
			}
			return nil
		},
	})
}
