package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/agent"
	"github.com/village-cni/village/pkg/nodelocal"
)

// dhcpLab is a LAN whose router (its own namespace, 192.168.77.1) runs
// Debian's dnsmasq as the DHCP server, with a reservation for one MAC.
type dhcpLab struct {
	lan    *LAN
	router ns.NetNS
	log    *lockedBuffer // dnsmasq's --log-dhcp output
	leases string        // dnsmasq's lease file
}

const (
	dhcpMAC      = "02:42:c0:a8:4d:78"
	dhcpReserved = "192.168.77.120"
	// dhcpT1 is the renewal time the server hands out (option 58), so the
	// test sees renewals without waiting out dnsmasq's 2-minute minimum
	// lease; dhcpT2 is the rebinding time (option 59).
	dhcpT1 = 3
	dhcpT2 = 100
)

func newDHCPLab(t testing.TB) *dhcpLab {
	t.Helper()
	dnsmasq, err := exec.LookPath("dnsmasq")
	if err != nil {
		if dnsmasq, err = exec.LookPath("/usr/sbin/dnsmasq"); err != nil {
			t.Fatalf("dnsmasq is needed (scripts/deps.sh installs dnsmasq-base): %v", err)
		}
	}
	lab := &dhcpLab{lan: NewLAN(t), router: testenv.NewNS(t), log: &lockedBuffer{}}
	lab.lan.Attach(t, lab.router, "eth0", "192.168.77.1/24")
	dir := t.TempDir()
	lab.leases = filepath.Join(dir, "leases")
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(lab.router.Path()), dnsmasq,
		"--no-daemon", "--conf-file=/dev/null", "--port=0", "--user=root", "--pid-file=",
		"--interface=eth0", "--bind-interfaces", "--log-dhcp", "--log-facility=-", "--dhcp-authoritative",
		"--dhcp-leasefile="+lab.leases,
		"--dhcp-range=192.168.77.100,192.168.77.150,255.255.255.0,2m",
		"--dhcp-host="+dhcpMAC+","+dhcpReserved,
		fmt.Sprintf("--dhcp-option=58,%d", dhcpT1), fmt.Sprintf("--dhcp-option=59,%d", dhcpT2))
	cmd.Stdout, cmd.Stderr = lab.log, lab.log
	must(t, cmd.Start(), "starting dnsmasq")
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("dnsmasq log:\n%s", lab.log.String())
		}
	})
	waitFor(t, 30*time.Second, "dnsmasq serving DHCP", func() (bool, string) {
		return strings.Contains(lab.log.String(), "DHCP, IP range"), lab.log.String()
	})
	return lab
}

// count is how many lines of the server's log show msg (DHCPDISCOVER,
// DHCPREQUEST, DHCPACK, DHCPRELEASE, ...) for the reserved MAC.
func (lab *dhcpLab) count(msg string) int {
	n := 0
	for _, line := range strings.Split(lab.log.String(), "\n") {
		if strings.Contains(line, " "+msg+"(eth0) ") && strings.Contains(line, " "+dhcpMAC) {
			n++
		}
	}
	return n
}

func (lab *dhcpLab) waitCount(t *testing.T, msg string, atLeast int, why string) {
	t.Helper()
	waitFor(t, 60*time.Second, why, func() (bool, string) {
		return lab.count(msg) >= atLeast, lab.log.String()
	})
}

// dhcpNode is a node on the lab's LAN running `villaged run` for the
// network's DHCP client, with its run and lease directories.
type dhcpNode struct {
	*Node
	conf, socket, leaseDir string
	log                    *lockedBuffer
	cmd                    *exec.Cmd
	done                   chan struct{}
}

func (lab *dhcpLab) newNode(t testing.TB, addr string) *dhcpNode {
	t.Helper()
	n := &dhcpNode{Node: NewNode(t)}
	lab.lan.Attach(t, n.NS, "lan0", addr+"/24")
	testenv.MustIP(t, n.NS, "route", "add", "default", "via", "192.168.77.1")
	// Not the default agent.sock: "daemonSocketPath" names the agent's
	// socket, for the agent and the plugin alike.
	n.socket = filepath.Join(n.Dir, "run", "lan-agent.sock")
	n.leaseDir = filepath.Join(n.Dir, "dhcp")
	n.conf = filepath.Join(n.Dir, "dhcp.conflist")
	must(t, os.WriteFile(n.conf, []byte(dhcpList(n.Node, n.socket)), 0o600), "writing the conflist")
	t.Cleanup(func() {
		n.stop(syscall.SIGTERM)
		if t.Failed() && n.log != nil {
			t.Logf("villaged log of %s:\n%s", n.Name(), n.log.String())
		}
	})
	return n
}

// dhcpList is a LAN network whose net1 addresses come from the LAN's DHCP
// server through the node's villaged; every pod of it has dhcpMAC (one pod
// at a time: a stand-in for the per-pod stable MAC).
func dhcpList(n *Node, socket string) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"landhcp","plugins":[{"type":"village","bridge":"vlg-dhcp","isDefaultGateway":true,"ipMasq":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.52.1.0/24"}]]},
		"macvlan":{"master":"lan0","mode":"bridge","ifName":"net1","mac":%q,"ipam":{"type":"dhcp","daemonSocketPath":%q}}}]}`,
		filepath.Join(n.Dir, "pods"), dhcpMAC, socket)
}

func (n *dhcpNode) start(t testing.TB) {
	t.Helper()
	if n.log == nil {
		n.log = &lockedBuffer{}
	}
	n.cmd = exec.Command("ip", "netns", "exec", n.Name(), filepath.Join(testenv.Bins(t), "villaged"), "run",
		"--conf", n.conf, "--node-name", n.Name(), "--run-dir", filepath.Join(n.Dir, "run"), "--dhcp-dir", n.leaseDir, "--metrics-addr", "off",
		"--period", agent.DefaultPeriod.String(), "--safety-net", agent.DefaultPeriod.String())
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	must(t, n.cmd.Start(), "starting villaged")
	n.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(n.cmd, n.done)
	waitFor(t, 30*time.Second, "villaged serving DHCP on its socket", func() (bool, string) {
		return strings.Contains(n.log.String(), "dhcp: serving LAN leases on "+n.socket), n.log.String()
	})
}

func (n *dhcpNode) stop(sig syscall.Signal) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	<-n.done
	n.cmd = nil
}

// TestLANDHCPReservation: a LAN pod's net1 address comes from the LAN's own
// DHCP server (dnsmasq), by the MAC reservation; villaged renews the lease
// while the pod lives, an agent killed and started again resumes renewing
// (and the killed one released nothing), DEL releases it, and the pod
// started again on another node with the same MAC gets the same address.
func TestLANDHCPReservation(t *testing.T) {
	lab := newDHCPLab(t)
	n1 := lab.newNode(t, "192.168.77.10")
	n1.start(t)
	l := ConfList(t, dhcpList(n1.Node, n1.socket))
	if fi, err := os.Stat(n1.socket); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("DHCP socket %s: %v %v, want a socket only root may open (0600)", n1.socket, fi, err)
	}

	p := n1.NewPod()
	r := n1.MustAdd(l, p)
	if ip := lanIP(t, r); ip != dhcpReserved {
		t.Fatalf("net1 got %s, want the reserved %s", ip, dhcpReserved)
	}
	if got := podAddrs(t, p, "net1"); !strings.Contains(got, dhcpReserved+"/24") {
		t.Fatalf("net1 in the pod: %s, want %s/24", got, dhcpReserved)
	}
	if rt := testenv.MustIP(t, p.NS, "route", "show", "default"); !strings.Contains(rt, "dev eth0") {
		t.Fatalf("default route left eth0: %s", rt)
	}
	must(t, testenv.Ping(lab.router, dhcpReserved, 2), "LAN router -> the pod's leased address")
	must(t, n1.Check(l, p), "CHECK of a DHCP LAN pod")
	// An ADD repeated by the runtime gets the lease the agent holds: no new
	// DISCOVER.
	if ip := lanIP(t, n1.MustAdd(l, p)); ip != dhcpReserved {
		t.Fatalf("repeated ADD: net1 got %s, want %s", ip, dhcpReserved)
	}

	// A renewal at T1, seen by the server: a REQUEST that no DISCOVER
	// preceded, answered by an ACK.
	acks := lab.count("DHCPACK")
	lab.waitCount(t, "DHCPACK", acks+1, "the server acknowledging a renewal")
	if d := testenv.DiscoversAfterAck(lab.log.String(), "eth0", dhcpMAC); d != 0 {
		t.Fatalf("%d DISCOVERs after the first ACK: a renewal must not start over\n%s", d, lab.log.String())
	}
	waitFor(t, 30*time.Second, "villaged reporting the renewal", func() (bool, string) {
		return strings.Contains(n1.log.String(), "renewed "+dhcpReserved), n1.log.String()
	})

	// The agent dies: nothing is released; a new agent resumes the lease
	// from disk and renews it.
	n1.stop(syscall.SIGKILL)
	if lab.count("DHCPRELEASE") != 0 {
		t.Fatalf("a killed agent released the lease:\n%s", lab.log.String())
	}
	before := lab.count("DHCPACK")
	n1.log = &lockedBuffer{}
	n1.start(t)
	lab.waitCount(t, "DHCPACK", before+1, "a renewal by the restarted agent")
	if !strings.Contains(n1.log.String(), "resumed lease "+dhcpReserved) {
		t.Fatalf("the restarted agent did not resume the lease:\n%s", n1.log.String())
	}
	if testenv.DiscoversAfterAck(lab.log.String(), "eth0", dhcpMAC) != 0 {
		t.Fatalf("the restarted agent started over instead of renewing:\n%s", lab.log.String())
	}

	// DEL releases the lease: DHCPRELEASE on the server, gone from its
	// lease file, and nothing left in villaged's lease directory.
	mustExist(t, n1.leaseDir)
	if len(files(t, n1.leaseDir)) != 1 {
		t.Fatalf("lease directory %s: %v, want the pod's lease", n1.leaseDir, files(t, n1.leaseDir))
	}
	must(t, n1.Del(l, p), "DEL of the DHCP LAN pod")
	lab.waitCount(t, "DHCPRELEASE", 1, "the server seeing DEL's DHCPRELEASE")
	waitFor(t, 30*time.Second, "the server dropping the released lease", func() (bool, string) {
		b, _ := os.ReadFile(lab.leases)
		return !strings.Contains(string(b), dhcpMAC), string(b)
	})
	if left := files(t, n1.leaseDir); len(left) != 0 {
		t.Fatalf("leases left after DEL: %v", left)
	}
	must(t, n1.Del(l, p), "DEL repeated")

	// The pod comes back on another node, with the same MAC.
	n2 := lab.newNode(t, "192.168.77.11")
	n2.start(t)
	l2 := ConfList(t, dhcpList(n2.Node, n2.socket))
	p2 := n2.NewPod()
	if ip := lanIP(t, n2.MustAdd(l2, p2)); ip != dhcpReserved {
		t.Fatalf("on the second node net1 got %s, want the reserved %s", ip, dhcpReserved)
	}
	must(t, testenv.Ping(lab.router, dhcpReserved, 2), "LAN router -> the pod on its new node")
	must(t, n2.Del(l2, p2), "DEL on the second node")
	lab.waitCount(t, "DHCPRELEASE", 2, "the server seeing the second DEL's DHCPRELEASE")
}

// TestLANDHCPAgentDown: with villaged down, an ADD outside Kubernetes
// fails at once naming the agent (code 11, the runtime tries again) and
// leaves nothing in the pod; DEL succeeds (nothing renews the lease, it
// lapses); STATUS reports the plugin unavailable (50). A Kubernetes pod's
// ADD waits for the agent within AgentWait, as its annotated LAN ask does
// (after a reboot the kubelet starts sandboxes before the agent's
// DaemonSet pod): past the bound it fails with code 11 naming the socket
// and the wait, leaving nothing; started before villaged, it gets its
// lease once villaged is up. With villaged up, GC releases the lease of a
// pod the runtime no longer lists.
func TestLANDHCPAgentDown(t *testing.T) {
	lab := newDHCPLab(t)
	n := lab.newNode(t, "192.168.77.10")
	l := ConfList(t, dhcpList(n.Node, n.socket))
	p := n.NewPod()
	_, err := n.Add(l, p)
	if err == nil || cniCode(err) != 11 || !strings.Contains(err.Error(), "villaged") || !strings.Contains(err.Error(), n.socket) {
		t.Fatalf("ADD with villaged down: %v (code %d), want code 11 naming villaged and %s", err, cniCode(err), n.socket)
	}
	if out := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(out, "net1") || strings.Contains(out, "eth0") {
		t.Fatalf("failed ADD left interfaces: %s", out)
	}
	must(t, n.Del(l, p), "DEL with villaged down")
	if err := n.Status(l); err == nil || !strings.Contains(err.Error(), "villaged") {
		t.Fatalf("STATUS with villaged down: %v, want an error naming villaged", err)
	}

	// A Kubernetes pod's ADD, with no agent within the bound.
	withPluginEnv(t, n.Node, nodelocal.AgentWaitEnv+"=1s")
	early := n.NewPod()
	start := time.Now()
	_, err = addArgs(n.Node, l, early, k8sPodArgs(early)...)
	if took := time.Since(start); took < time.Second {
		t.Errorf("Kubernetes ADD with no agent failed after %s, before the bound 1s: it did not wait", took)
	}
	if err == nil || cniCode(err) != 11 || !strings.Contains(err.Error(), n.socket) || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("Kubernetes ADD with no agent: %v (code %d), want code 11 naming %s and the wait", err, cniCode(err), n.socket)
	}
	if out := testenv.MustIP(t, early.NS, "-o", "link"); strings.Contains(out, "net1") || strings.Contains(out, "eth0") {
		t.Fatalf("failed ADD left interfaces: %s", out)
	}

	// A Kubernetes pod's ADD started before villaged: it is under way (its
	// net1 exists, waiting for its lease) when villaged starts, and gets
	// the reserved address.
	withPluginEnv(t, n.Node, nodelocal.AgentWaitEnv+"=2m")
	k := n.NewPod()
	done := addAsync(n.Node, l, k, k8sPodArgs(k)...)
	var a *addAnswer
	waitFor(t, 60*time.Second, "the Kubernetes pod's ADD under way (net1 made) or ended", func() (bool, string) {
		select {
		case got := <-done:
			a = &got
			return true, ""
		default:
		}
		return hasLink(t, k, "net1"), testenv.MustIP(t, k.NS, "-o", "link")
	})
	if a != nil {
		t.Fatalf("the Kubernetes pod's ADD ended before villaged started: %v (code %d), want it to wait for the agent", a.err, cniCode(a.err))
	}
	n.start(t)
	got := <-done
	must(t, got.err, "the Kubernetes pod's ADD started before villaged")
	if ip := lanIP(t, got.r); ip != dhcpReserved {
		t.Fatalf("net1 got %s after the wait, want the reserved %s", ip, dhcpReserved)
	}
	if addrs := podAddrs(t, k, "net1"); !strings.Contains(addrs, dhcpReserved+"/24") {
		t.Fatalf("net1 in the pod: %s, want %s/24", addrs, dhcpReserved)
	}
	must(t, testenv.Ping(lab.router, dhcpReserved, 2), "LAN router -> the lease of the pod that waited")
	must(t, n.Status(l), "STATUS with villaged up")

	// GC with the pod no longer listed releases its lease.
	if len(files(t, n.leaseDir)) != 1 {
		t.Fatalf("lease directory %s: %v, want the pod's lease", n.leaseDir, files(t, n.leaseDir))
	}
	must(t, n.GC(l, p), "GC listing another pod")
	lab.waitCount(t, "DHCPRELEASE", 1, "the server seeing GC's DHCPRELEASE")
	if left := files(t, n.leaseDir); len(left) != 0 {
		t.Fatalf("leases kept after GC: %v", left)
	}
	must(t, n.Del(l, k), "DEL after GC")
}
