package e2e

// Netfilter behaviour on namespace nodes, proven with packets: masquerade
// that heals after a flush (each backend, each iptables variant), forward
// accept rules on hosts whose forwarding policy drops, macspoofchk and
// portIsolation.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
)

// tcpdump captures packets matching filter inside a namespace.
type tcpdump struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startTcpdump(t *testing.T, n ns.NetNS, iface, filter string) *tcpdump {
	t.Helper()
	c := &tcpdump{}
	c.cmd = exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "tcpdump", "-i", iface, "-e", "-nn", "-l", "-U", "-p", filter)
	c.cmd.Stdout = &c.out
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	t.Cleanup(func() { c.stop() })
	ready := make(chan string, 1)
	go func() {
		var seen []byte
		buf := make([]byte, 4096)
		for {
			k, err := stderr.Read(buf)
			seen = append(seen, buf[:k]...)
			if bytes.Contains(seen, []byte("listening on")) || err != nil {
				ready <- string(seen)
				_, _ = bytes.NewBuffer(nil).ReadFrom(stderr)
				return
			}
		}
	}()
	select {
	case msg := <-ready:
		if !strings.Contains(msg, "listening on") {
			t.Fatalf("tcpdump did not start: %s", msg)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("tcpdump did not start in 20s")
	}
	return c
}

// stop ends the capture and returns what it printed.
func (c *tcpdump) stop() string {
	if c.cmd.ProcessState == nil {
		time.Sleep(300 * time.Millisecond) // let the last packets through
		_ = c.cmd.Process.Signal(os.Interrupt)
		_ = c.cmd.Wait()
	}
	return c.out.String()
}

// outside is a host outside the cluster behind node: a namespace on a link
// of its own (203.0.113.0/24) with no route to any pod network, so only
// masqueraded traffic gets an answer.
func outside(t *testing.T, node ns.NetNS) ns.NetNS {
	t.Helper()
	ext := testenv.NewNS(t)
	testenv.MustIP(t, node, "link", "add", "ext0", "type", "veth", "peer", "name", "eth0", "netns", filepath.Base(ext.Path()))
	testenv.MustIP(t, node, "addr", "add", "203.0.113.1/24", "dev", "ext0")
	testenv.MustIP(t, node, "link", "set", "ext0", "up")
	testenv.MustIP(t, ext, "addr", "add", "203.0.113.2/24", "dev", "eth0")
	testenv.MustIP(t, ext, "link", "set", "eth0", "up")
	return ext
}

// egressSeenAs pings the outside host from pod and returns an error unless
// the echo requests reached it with source src (tcpdump on the outside host).
func egressSeenAs(t *testing.T, pod, ext ns.NetNS, src string) error {
	t.Helper()
	c := startTcpdump(t, ext, "eth0", "icmp")
	err := testenv.Ping(pod, "203.0.113.2", 2)
	got := c.stop()
	if err != nil {
		return fmt.Errorf("%w (the outside host saw: %q)", err, got)
	}
	if !strings.Contains(got, src+" > 203.0.113.2: ICMP echo request") {
		return fmt.Errorf("the outside host did not see the echo requests from %s:\n%s", src, got)
	}
	return nil
}

// podToPodKeepsSource pings dst (a pod on another node) from pod and checks,
// inside the destination pod, that the requests carry the source pod's
// own address (no masquerade inside clusterCIDR).
func podToPodKeepsSource(t *testing.T, from *Pod, fromIP string, to *Pod, toIP string) error {
	t.Helper()
	c := startTcpdump(t, to.NS, "eth0", "icmp")
	err := testenv.Ping(from.NS, toIP, 2)
	got := c.stop()
	if err != nil {
		return err
	}
	if !strings.Contains(got, fromIP+" > "+toIP+": ICMP echo request") {
		return fmt.Errorf("pod %s did not see requests from %s itself:\n%s", toIP, fromIP, got)
	}
	return nil
}

func v4Of(t *testing.T, n *clusterNode, l *libcni.NetworkConfigList, p *Pod) string {
	t.Helper()
	r := n.MustAdd(l, p)
	for _, ipc := range r.IPs {
		if ipc.Address.IP.To4() != nil {
			return ipc.Address.IP.String()
		}
	}
	t.Fatalf("pod %s got no IPv4 address: %v", p.ID, r.IPs)
	return ""
}

// TestMasqueradeHealsAfterFlush: the nat rules are flushed with the tool a
// user would use; the next ADD (of another pod) puts them back, and a pod
// added BEFORE the flush reaches a host outside the cluster with the node's
// address again, while pod-to-pod traffic across nodes keeps its source.
// CHECK reports a flush and repairs it too.
func TestMasqueradeHealsAfterFlush(t *testing.T) {
	for _, c := range []struct {
		name, extra string
		flush       []string
	}{
		{"nftables/nft-flush-ruleset", `,"ipMasqBackend":"nftables"`, []string{"nft", "flush", "ruleset"}},
		{"auto/nft-flush-ruleset", ``, []string{"nft", "flush", "ruleset"}},
		{"iptables/iptables-t-nat-F", `,"ipMasqBackend":"iptables"`, []string{"iptables", "-t", "nat", "-F"}},
		{"iptables/nft-flush-ruleset", `,"ipMasqBackend":"iptables"`, []string{"nft", "flush", "ruleset"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes := staticCluster(t)[:2]
			n1, n2 := nodes[0], nodes[1]
			ext := outside(t, n1.NS)
			l1, l2 := n1.list(t, "host-gw", nodes, c.extra), n2.list(t, "host-gw", nodes, c.extra)
			old, remote := n1.NewPod(), n2.NewPod()
			oldIP, remoteIP := v4Of(t, n1, l1, old), v4Of(t, n2, l2, remote)

			must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress before the flush")
			must(t, podToPodKeepsSource(t, old, oldIP, remote, remoteIP), "pod to pod before the flush")

			inNS(t, n1.NS, c.flush...)
			if err := testenv.Ping(old.NS, "203.0.113.2", 1); err == nil {
				t.Fatalf("egress still works after %v: the flush did not remove the masquerade", c.flush)
			}
			n1.MustAdd(l1, n1.NewPod())
			must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress of the old pod after %v and one more ADD", c.flush)
			must(t, podToPodKeepsSource(t, old, oldIP, remote, remoteIP), "pod to pod after the repair")

			// CHECK: reports and repairs.
			inNS(t, n1.NS, c.flush...)
			err := n1.Check(l1, old)
			if err == nil || !strings.Contains(err.Error(), "restored") {
				t.Fatalf("CHECK after %v: %v, want the drift reported and restored", c.flush, err)
			}
			must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress after CHECK repaired")
			must(t, n1.Check(l1, old), "CHECK after CHECK repaired")
		})
	}
}

// TestForwardAcceptOnLockedDownNodes: nodes whose forwarding policy drops
// (Docker's `iptables -P FORWARD DROP`, set before the first ADD; a
// firewalld-like nftables table whose forward chain drops, loaded after it)
// still carry pod egress, node-to-pod and pod-to-pod traffic across nodes
// over host-gw and vxlan; with forwardAccept false they do not.
func TestForwardAcceptOnLockedDownNodes(t *testing.T) {
	docker := func(t *testing.T, n ns.NetNS) { inNS(t, n, "iptables", "-P", "FORWARD", "DROP") }
	firewalld := func(t *testing.T, n ns.NetNS) {
		inNS(t, n, "nft", "add", "table", "inet", "fwlike")
		inNS(t, n, "nft", "add chain inet fwlike filter_FORWARD { type filter hook forward priority 10; policy drop; }")
	}
	for _, mode := range []string{"host-gw", "vxlan"} {
		for _, c := range []struct {
			name        string
			extra       string
			lockBefore  func(*testing.T, ns.NetNS)
			lockAfter   func(*testing.T, ns.NetNS)
			wantForward bool
		}{
			{"docker/auto", ``, docker, nil, true},
			{"docker/iptables", `,"ipMasqBackend":"iptables"`, docker, nil, true},
			{"firewalld/auto", ``, nil, firewalld, true},
			{"docker/forwardAccept=false", `,"forwardAccept":false`, docker, nil, false},
			{"firewalld/forwardAccept=false", `,"forwardAccept":false`, nil, firewalld, false},
		} {
			t.Run(mode+"/"+c.name, func(t *testing.T) {
				nodes := staticCluster(t)[:2]
				n1, n2 := nodes[0], nodes[1]
				ext := outside(t, n1.NS)
				for _, n := range nodes {
					if c.lockBefore != nil {
						c.lockBefore(t, n.NS)
					}
				}
				l1, l2 := n1.list(t, mode, nodes, c.extra), n2.list(t, mode, nodes, c.extra)
				a, b := n1.NewPod(), n2.NewPod()
				aIP, bIP := v4Of(t, n1, l1, a), v4Of(t, n2, l2, b)
				if c.lockAfter != nil {
					// The firewall loads after the pods: the next ADD on each
					// node sees the ruleset generation move and adds the rules.
					for i, n := range nodes {
						c.lockAfter(t, n.NS)
						n.MustAdd([]*libcni.NetworkConfigList{l1, l2}[i], n.NewPod())
					}
				}
				checks := []struct {
					what string
					err  func() error
				}{
					{"pod egress", func() error { return egressSeenAs(t, a.NS, ext, "203.0.113.1") }},
					{"node2 to a pod on node1", func() error { return testenv.Ping(n2.NS, aIP, 2) }},
					{"pod to pod across nodes", func() error { return podToPodKeepsSource(t, a, aIP, b, bIP) }},
				}
				for _, ch := range checks {
					err := ch.err()
					if c.wantForward && err != nil {
						t.Errorf("%s: %v", ch.what, err)
					}
					if !c.wantForward && err == nil {
						t.Errorf("%s works with forwardAccept false: the node's forward drop is not in effect, nothing was tested", ch.what)
					}
				}
				must(t, testenv.Ping(n1.NS, aIP, 1), "the node reaches its own pod")
			})
		}
	}
}
