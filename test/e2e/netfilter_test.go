package e2e

// Netfilter behaviour on namespace nodes, proven with packets: masquerade
// that heals after a flush (each backend, each iptables variant), forward
// accept rules on hosts whose forwarding policy drops, macspoofchk and
// portIsolation.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/village"
)

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
	c := testenv.StartCapture(t, ext, "eth0", "icmp")
	err := testenv.Ping(pod, "203.0.113.2", 2)
	got := c.Stop()
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
	c := testenv.StartCapture(t, to.NS, "eth0", "icmp")
	err := testenv.Ping(from.NS, toIP, 2)
	got := c.Stop()
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
// CHECK reports a flush with code 111 and changes nothing: the old pod's
// egress stays broken until the next ADD repairs it.
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

			// CHECK reports and writes nothing; the next ADD repairs.
			inNS(t, n1.NS, c.flush...)
			checkReportsOnly(t, n1.Node, l1, old, "masquerade")
			if err := testenv.Ping(old.NS, "203.0.113.2", 1); err == nil {
				t.Fatalf("egress works after %v and a CHECK: CHECK repaired the masquerade", c.flush)
			}
			n1.MustAdd(l1, n1.NewPod())
			must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress after the ADD that followed CHECK")
			must(t, n1.Check(l1, old), "CHECK after the ADD repaired")
		})
	}
}

// checkReportsOnly runs CHECK of p on a node whose netfilter rules were
// changed behind Village's back: it must fail with code 111 naming what
// (want), and leave the node's netfilter state exactly as it was.
func checkReportsOnly(t *testing.T, n *Node, l *libcni.NetworkConfigList, p *Pod, want string) {
	t.Helper()
	before := netfilterState(t, n.NS)
	err := n.Check(l, p)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != village.ErrCodeNodeDrift || !strings.Contains(te.Msg, want) {
		t.Fatalf("CHECK with the rules changed: %#v, want code %d naming %q", err, village.ErrCodeNodeDrift, want)
	}
	if after := netfilterState(t, n.NS); after != before {
		t.Fatalf("CHECK changed the node's netfilter state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// netfilterState is the node's nf_tables ruleset and its iptables and
// ip6tables rules (legacy and nft variants), comments and counters left out.
func netfilterState(t *testing.T, node ns.NetNS) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range [][]string{{"nft", "--stateless", "list", "ruleset"}, {"iptables-legacy-save"}, {"ip6tables-legacy-save"}, {"iptables-nft-save"}, {"ip6tables-nft-save"}} {
		fmt.Fprintf(&b, "== %s\n", strings.Join(cmd, " "))
		for _, line := range strings.Split(inNS(t, node, cmd...), "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if strings.HasPrefix(line, ":") { // ":CHAIN POLICY [packets:bytes]"
				line, _, _ = strings.Cut(line, " [")
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// TestForwardAcceptOnLockedDownNodes: nodes whose forwarding policy drops
// (Docker's `iptables -P FORWARD DROP`, set before the first ADD; a
// firewalld-like nftables table whose forward chain rejects, loaded after it)
// still carry pod egress, node-to-pod and pod-to-pod traffic across nodes
// over host-gw and vxlan; with forwardAccept false they do not.
func TestForwardAcceptOnLockedDownNodes(t *testing.T) {
	docker := func(t *testing.T, n ns.NetNS) { inNS(t, n, "iptables", "-P", "FORWARD", "DROP") }
	// firewalld's shape: policy accept, established traffic accepted, the
	// rest rejected by the last rule.
	firewalld := func(t *testing.T, n ns.NetNS) {
		inNS(t, n, "nft", "add", "table", "inet", "fwlike")
		inNS(t, n, "nft", "add chain inet fwlike filter_FORWARD { type filter hook forward priority 10; policy accept; }")
		inNS(t, n, "nft", "add rule inet fwlike filter_FORWARD ct state established,related accept")
		inNS(t, n, "nft", "add rule inet fwlike filter_FORWARD reject with icmpx admin-prohibited")
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

// bridgeList is a one-node IPv4 conflist on its own bridge with extra keys
// (JSON members, each followed by a comma) in the village entry.
func bridgeList(t *testing.T, n *Node, name, subnet, extra string) *libcni.NetworkConfigList {
	return ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":"b-%s","isGateway":true,%s
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]]}}]}`, name, name, extra, filepath.Join(n.Dir, name), subnet))
}

func addV4(t *testing.T, n *Node, l *libcni.NetworkConfigList, p *Pod) string {
	t.Helper()
	r := n.MustAdd(l, p)
	return r.IPs[0].Address.IP.String()
}

// spoofedPing changes a's eth0 MAC, clears both pods' neighbour caches and
// pings b, capturing inside b. It returns the ping error, what b saw from
// the spoofed MAC, and restores a's MAC.
func spoofedPing(t *testing.T, a, b *Pod, bIP string) (error, string) {
	t.Helper()
	orig := strings.Fields(strings.SplitAfter(testenv.MustIP(t, a.NS, "-o", "link", "show", "eth0"), "link/ether ")[1])[0]
	const spoofed = "02:00:00:00:be:ef"
	testenv.MustIP(t, a.NS, "link", "set", "eth0", "address", spoofed)
	defer testenv.MustIP(t, a.NS, "link", "set", "eth0", "address", orig)
	for _, p := range []*Pod{a, b} {
		testenv.MustIP(t, p.NS, "neigh", "flush", "dev", "eth0")
	}
	c := testenv.StartCapture(t, b.NS, "eth0", "ether src "+spoofed)
	err := testenv.Ping(a.NS, bIP, 2)
	return err, c.Stop()
}

// TestMacSpoofChk: a pod that changes its MAC reaches nobody with
// macspoofchk on (b's capture sees no frame from the spoofed address), and
// does without it; its own MAC keeps working; CHECK reports a flushed rule
// and the next ADD restores it; DEL removes the pod's rule.
func TestMacSpoofChk(t *testing.T) {
	n := NewNode(t)
	on := bridgeList(t, n, "spoof", "10.81.0.0/24", `"macspoofchk":true,`)
	off := bridgeList(t, n, "nospoof", "10.82.0.0/24", ``)
	a, b := n.NewPod(), n.NewPod()
	addV4(t, n, on, a)
	bIP := addV4(t, n, on, b)
	must(t, testenv.Ping(a.NS, bIP, 1), "pods with their own MACs")
	err, seen := spoofedPing(t, a, b, bIP)
	if err == nil || strings.TrimSpace(seen) != "" {
		t.Fatalf("with macspoofchk, a spoofed MAC got through: ping %v; b saw:\n%s", err, seen)
	}
	must(t, testenv.Ping(a.NS, bIP, 2), "a with its MAC back")

	c, d := n.NewPod(), n.NewPod()
	addV4(t, n, off, c)
	dIP := addV4(t, n, off, d)
	err, seen = spoofedPing(t, c, d, dIP)
	if err != nil || !strings.Contains(seen, "02:00:00:00:be:ef") {
		t.Fatalf("without macspoofchk the spoofed MAC should get through (the control): ping %v; d saw:\n%s", err, seen)
	}

	// A flush: CHECK reports the pod's missing rule and puts nothing back
	// (a spoofed MAC gets through), the next ADD of another pod puts every
	// pod's rule back.
	inNS(t, n.NS, "nft", "flush", "ruleset")
	checkReportsOnly(t, n, on, a, "macspoofchk rule of")
	if err, seen := spoofedPing(t, a, b, bIP); err != nil || !strings.Contains(seen, "02:00:00:00:be:ef") {
		t.Fatalf("after a flush and a CHECK, a spoofed MAC should get through (CHECK repairs nothing): ping %v; b saw:\n%s", err, seen)
	}
	e := n.NewPod()
	addV4(t, n, on, e)
	if err, seen := spoofedPing(t, b, a, addrOf(t, a)); err == nil || strings.TrimSpace(seen) != "" {
		t.Fatalf("after a flush and one more ADD, a spoofed MAC from an old pod got through: %v\n%s", err, seen)
	}
	must(t, n.Del(on, a), "DEL")
	if r := inNS(t, n.NS, "nft", "list", "table", "bridge", "village-spoof"); strings.Count(r, "drop comment") != 2 {
		t.Fatalf("after DEL of one of three pods, want two macspoofchk rules:\n%s", r)
	}
}

func addrOf(t *testing.T, p *Pod) string {
	t.Helper()
	f := strings.Fields(testenv.MustIP(t, p.NS, "-o", "-4", "addr", "show", "dev", "eth0"))
	for i, w := range f {
		if w == "inet" {
			return strings.Split(f[i+1], "/")[0]
		}
	}
	t.Fatalf("no IPv4 address in pod %s", p.ID)
	return ""
}

// TestPortIsolation: pods on isolated ports cannot reach each other at L2
// but reach the gateway; pods of a bridge without it can.
func TestPortIsolation(t *testing.T) {
	n := NewNode(t)
	iso := bridgeList(t, n, "iso", "10.83.0.0/24", `"portIsolation":true,`)
	open := bridgeList(t, n, "open", "10.84.0.0/24", ``)
	a, b := n.NewPod(), n.NewPod()
	addV4(t, n, iso, a)
	bIP := addV4(t, n, iso, b)
	if err := testenv.Ping(a.NS, bIP, 2); err == nil {
		t.Fatal("pods on isolated ports reached each other")
	}
	must(t, testenv.Ping(a.NS, "10.83.0.1", 1), "an isolated pod reaches its gateway")
	if out := inNS(t, n.NS, "bridge", "-d", "link", "show", "master", "b-iso"); strings.Count(out, "isolated on") != 2 {
		t.Fatalf("want both ports isolated:\n%s", out)
	}
	c, d := n.NewPod(), n.NewPod()
	addV4(t, n, open, c)
	must(t, testenv.Ping(c.NS, addV4(t, n, open, d), 1), "pods without portIsolation")
}

// variantNode is a node whose plugin runs in a private mount namespace
// where /etc/alternatives (through which Debian's /usr/sbin/iptables and
// ip6tables resolve) points at the variant wanted: "legacy", "nft", or
// "none" (no iptables binary at all). Nothing outside the plugin process
// sees the change.
func variantNode(t *testing.T, variant string) *Node {
	t.Helper()
	for _, tool := range []string{"iptables", "ip6tables"} {
		if l, err := os.Readlink("/usr/sbin/" + tool); err != nil || l != "/etc/alternatives/"+tool {
			t.Fatalf("/usr/sbin/%s is not the alternatives link this test swaps (%q, %v)", tool, l, err)
		}
	}
	dir := t.TempDir()
	alt := filepath.Join(dir, "alternatives")
	sh(t, "cp", "-a", "/etc/alternatives/.", alt+"/")
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			link := filepath.Join(alt, tool+suffix)
			must(t, os.Remove(link), "remove %s", link)
			if variant != "none" {
				must(t, os.Symlink(fmt.Sprintf("/usr/sbin/%s-%s%s", tool, variant, suffix), link), "link %s", link)
			}
		}
	}
	script := fmt.Sprintf("#!/bin/sh\nexec unshare --mount --propagation private /bin/sh -c 'mount --bind %s /etc/alternatives && exec %s'\n",
		alt, filepath.Join(testenv.Bins(t), "village"))
	wrap := execDir(t, filepath.Join(dir, "bin"), map[string][]byte{"village": []byte(script)})
	n := NewNode(t)
	n.CNI = libcni.NewCNIConfigWithCacheDir(append([]string{wrap}, filepath.SplitList(testenv.CNIPath(t))...), filepath.Join(n.Dir, "cache"), nil)
	return n
}

// TestAutomaticBackendPerIptablesVariant: with no ipMasqBackend, a host whose
// iptables is the legacy variant gets the iptables backend (in the legacy
// tables, where its FORWARD drop lives), an iptables-nft host and a host
// without iptables get nftables. On each, egress leaves with the node's
// address through a FORWARD policy of drop, a flush with that host's tool
// is repaired by the next ADD, and the old pod's egress works again.
func TestAutomaticBackendPerIptablesVariant(t *testing.T) {
	for _, c := range []struct {
		variant      string
		lockDown     [][]string
		flush        []string
		wantIPTables bool
	}{
		{"legacy", [][]string{{"iptables-legacy", "-P", "FORWARD", "DROP"}}, []string{"iptables-legacy", "-t", "nat", "-F"}, true},
		{"nft", [][]string{{"iptables-nft", "-P", "FORWARD", "DROP"}}, []string{"nft", "flush", "ruleset"}, false},
		{"none", [][]string{{"nft", "add", "table", "inet", "fw"}, {"nft", "add chain inet fw fwd_chain { type filter hook forward priority 0; policy drop; }"}},
			[]string{"nft", "flush", "ruleset"}, false},
	} {
		t.Run(c.variant, func(t *testing.T) {
			n := variantNode(t, c.variant)
			ext := outside(t, n.NS)
			for _, cmd := range c.lockDown {
				inNS(t, n.NS, cmd...)
			}
			l := bridgeList(t, n, "auto"+c.variant, "10.85.0.0/24", `"ipMasq":true,"isDefaultGateway":true,"clusterCIDR":"10.85.0.0/16",`)
			old := n.NewPod()
			addV4(t, n, l, old)
			legacy := inNS(t, n.NS, "iptables-legacy-save")
			tables := inNS(t, n.NS, "nft", "list", "tables")
			if got := strings.Contains(legacy, masq.Chain("auto"+c.variant)); got != c.wantIPTables {
				t.Fatalf("%s host: masquerade chain in the legacy tables = %v, want %v\n%s", c.variant, got, c.wantIPTables, legacy)
			}
			if got := strings.Contains(tables, "inet "+masq.Table("auto"+c.variant)); got == c.wantIPTables {
				t.Fatalf("%s host: nftables table present = %v, want %v\n%s", c.variant, got, !c.wantIPTables, tables)
			}
			must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress on the %s host", c.variant)

			inNS(t, n.NS, c.flush...)
			if c.variant == "none" {
				// The firewall comes back with its reload; Village's rules do not.
				for _, cmd := range c.lockDown {
					inNS(t, n.NS, cmd...)
				}
			}
			if err := testenv.Ping(old.NS, "203.0.113.2", 1); err == nil {
				t.Fatalf("egress still works after %v", c.flush)
			}
			addV4(t, n, l, n.NewPod())
			must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress of the old pod after %v and one more ADD on the %s host", c.flush, c.variant)
			must(t, n.Del(l, old), "DEL")
		})
	}
}

// TestSwitchingBackendThroughADD: the network's config moves from
// ipMasqBackend iptables to nftables and back; each next ADD leaves the
// rules in the new backend only, and a pod added before the switch keeps
// its egress with the node's address.
func TestSwitchingBackendThroughADD(t *testing.T) {
	n := NewNode(t)
	ext := outside(t, n.NS)
	list := func(backend string) *libcni.NetworkConfigList {
		return bridgeList(t, n, "switch", "10.88.0.0/24", fmt.Sprintf(`"ipMasq":true,"isDefaultGateway":true,"ipMasqBackend":%q,`, backend))
	}
	old := n.NewPod()
	addV4(t, n, list("iptables"), old)
	for i, backend := range []string{"nftables", "iptables", "nftables"} {
		addV4(t, n, list(backend), n.NewPod())
		ipt := inNS(t, n.NS, "iptables-save") + inNS(t, n.NS, "ip6tables-save")
		tables := inNS(t, n.NS, "nft", "list", "tables")
		inIPT, inNFT := strings.Contains(ipt, masq.Chain("switch")), strings.Contains(tables, "inet "+masq.Table("switch"))
		if inIPT != (backend == "iptables") || inNFT != (backend == "nftables") {
			t.Fatalf("switch %d to %s: rules in iptables %v, in nftables %v\n%s\n%s", i+1, backend, inIPT, inNFT, ipt, tables)
		}
		must(t, egressSeenAs(t, old.NS, ext, "203.0.113.1"), "egress of the old pod after switching to %s", backend)
	}
}

// forgedPing pings b from a with source address src, held on a's eth0
// for the ping, both pods' neighbour caches cleared before and after; it returns the
// ping's error and what b saw from src (IP or ARP).
func forgedPing(t *testing.T, a, b *Pod, bIP, src string) (error, string) {
	t.Helper()
	flush := func() {
		for _, p := range []*Pod{a, b} {
			testenv.MustIP(t, p.NS, "neigh", "flush", "dev", "eth0")
		}
	}
	testenv.MustIP(t, a.NS, "addr", "add", src+"/32", "dev", "eth0")
	defer flush() // a's ARP from src failed: forget it
	defer testenv.MustIP(t, a.NS, "addr", "del", src+"/32", "dev", "eth0")
	flush()
	c := testenv.StartCapture(t, b.NS, "eth0", "src host "+src)
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(a.NS.Path()), "ping", "-n", "-c", "2", "-W", "1", "-I", src, bIP).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, out)
	}
	return err, c.Stop()
}

// TestSourceAddressCheck: with networkPolicy on, the plugin's ADD gives
// every pod port a source address check (NetworkPolicy decides by the
// source address): a pod that sends from an address not its own reaches
// nobody, b's capture sees neither its packets nor its ARP; without
// networkPolicy (the control) it does. Its own address keeps working, a
// flushed rule comes back with the next ADD, and DEL removes the pod's
// rules.
func TestSourceAddressCheck(t *testing.T) {
	n := NewNode(t)
	on := bridgeList(t, n, "srcchk", "10.83.0.0/24", `"networkPolicy":true,`)
	off := bridgeList(t, n, "nosrcchk", "10.84.0.0/24", ``)
	a, b := n.NewPod(), n.NewPod()
	addV4(t, n, on, a)
	bIP := addV4(t, n, on, b)
	// No agent runs here: the new pods stay pending (networkPolicy on)
	// until the controller compiles them. Play its part.
	compiled := func() { inNS(t, n.NS, "nft", "flush", "set", "inet", "village_pending-srcchk", "pending4") }
	compiled()
	if err := testenv.Ping(a.NS, bIP, 1); err != nil {
		t.Fatalf("pods with their own addresses: %v\n%s", err, inNS(t, n.NS, "nft", "list", "ruleset"))
	}
	if err, seen := forgedPing(t, a, b, bIP, "10.83.0.200"); err == nil || strings.TrimSpace(seen) != "" {
		t.Fatalf("with networkPolicy, a forged source address got through: ping %v; b saw:\n%s", err, seen)
	}
	must(t, testenv.Ping(a.NS, bIP, 2), "a from its own address again")

	c, d := n.NewPod(), n.NewPod()
	addV4(t, n, off, c)
	dIP := addV4(t, n, off, d)
	if err, seen := forgedPing(t, c, d, dIP, "10.84.0.200"); !strings.Contains(seen, "10.84.0.200") {
		t.Fatalf("without networkPolicy the forged source should get through (the control): ping %v; d saw:\n%s", err, seen)
	}

	inNS(t, n.NS, "nft", "flush", "ruleset")
	if err, seen := forgedPing(t, a, b, bIP, "10.83.0.201"); !strings.Contains(seen, "10.83.0.201") {
		t.Fatalf("after a flush the forged source should get through until the next ADD: ping %v; b saw:\n%s", err, seen)
	}
	e := n.NewPod()
	addV4(t, n, on, e)
	compiled()
	if err, seen := forgedPing(t, a, b, bIP, "10.83.0.202"); err == nil || strings.TrimSpace(seen) != "" {
		t.Fatalf("after a flush and one more ADD, a forged source from an old pod got through: ping %v; b saw:\n%s", err, seen)
	}
	must(t, n.Del(on, a), "DEL")
	if r := inNS(t, n.NS, "nft", "list", "table", "bridge", "village-srcchk"); strings.Count(r, "drop comment") != 2*3 {
		t.Fatalf("after DEL of one of three pods, want three rules (IPv4, ARP, IPv6) for each of two pods:\n%s", r)
	}
}
