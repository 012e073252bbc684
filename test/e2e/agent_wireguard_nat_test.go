package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
)

// The WireGuard lab with a home behind NAT: node1 and node2 on the LAN;
// node3 and node4 on a home LAN behind a home router, whose only way out
// is its uplink to an ISP router on the LAN (192.168.79.1). The home's
// public address is natPublic, which the LAN routes through the ISP
// router. The home router
//
//   - masquerades the home's traffic to random ports 20000-29999 (a NAT
//     that forgets a mapping gives a new port), its UDP conntrack timeouts
//     set to natUDPTimeout;
//   - forwards UDP port natForward of its public address to node4's
//     WireGuard port (node4 publishes that endpoint and sends no
//     keepalive: it never speaks first);
//   - clamps the MSS of TCP through it to the uplink's MTU, as home
//     routers on a small uplink do (the agents' API connections).
//
// The uplink has a smaller MTU (natUplinkMTU) than every node's 1500, a
// hop no node knows about, and both routers drop every ICMP
// "fragmentation needed" they would send or forward.
//
// The agents run with persistentKeepalive natKeepalive and a pass every
// second (each pass sets the device's peers).
const (
	natISPLAN     = "192.168.79.1"
	natPublic     = "10.78.0.2"
	natSitePrefix = "10.79.0."
	natUplinkMTU  = 1400
	natKeepalive  = 2 * time.Second
	natUDPTimeout = 5 * time.Second
	natForward    = 51824
)

type natRouter struct {
	natSite
	ns, isp ns.NetNS
	site    *LAN
}

// natSite is where a home sits: its ISP router's address on the LAN, the
// /30 of the uplink (ISP .1, home router .2, the home's public address)
// and its home LAN's /24 prefix.
type natSite struct {
	ispLAN, uplink, prefix string
}

// public is the home's public address.
func (s natSite) public() string { return s.uplink + "2" }

// home1 is TestAgentWireGuardNAT's home (natPublic, natSitePrefix); home2
// a second one behind its own ISP router and NAT.
var (
	home1 = natSite{ispLAN: natISPLAN, uplink: "10.78.0.", prefix: natSitePrefix}
	home2 = natSite{ispLAN: "192.168.79.2", uplink: "10.78.1.", prefix: "10.79.1."}
)

// dropFragNeeded is the nftables table that drops ICMP "fragmentation
// needed" forwarded or sent.
const dropFragNeeded = `
table ip filter {
	chain forward_f { type filter hook forward priority filter; icmp type destination-unreachable icmp code frag-needed drop; }
	chain output_f { type filter hook output priority filter; icmp type destination-unreachable icmp code frag-needed drop; }
}
`

// newNATRouter makes the ISP router of site on lab's LAN, the home router
// behind it and the home LAN, and routes the LAN's namespaces (those made
// so far) to the home's public address.
func newNATRouter(t *testing.T, lab *agentLab, site natSite) *natRouter {
	r := &natRouter{natSite: site, ns: testenv.NewNS(t), isp: testenv.NewNS(t), site: NewLAN(t)}
	lab.lan.Attach(t, r.isp, "eth0", site.ispLAN+"/24")
	testenv.MustIP(t, r.isp, "link", "add", "wan0", "mtu", strconv.Itoa(natUplinkMTU), "type", "veth",
		"peer", "name", "wan0", "mtu", strconv.Itoa(natUplinkMTU), "netns", filepath.Base(r.ns.Path()))
	testenv.MustIP(t, r.isp, "addr", "add", site.uplink+"1/30", "dev", "wan0")
	testenv.MustIP(t, r.isp, "link", "set", "wan0", "up")
	testenv.MustIP(t, r.ns, "addr", "add", site.public()+"/30", "dev", "wan0")
	testenv.MustIP(t, r.ns, "link", "set", "wan0", "up")
	testenv.MustIP(t, r.ns, "route", "add", "default", "via", site.uplink+"1")
	r.site.Attach(t, r.ns, "eth1", site.prefix+"1/24")
	for _, n := range []ns.NetNS{r.isp, r.ns} {
		must(t, testenv.InNS(n, func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }), "router forwarding")
	}
	dir := t.TempDir()
	isp := filepath.Join(dir, "isp.nft")
	must(t, os.WriteFile(isp, []byte(dropFragNeeded), 0o644), "writing the ISP router's rules")
	testenv.Nft(t, r.isp, "-f", isp)
	home := filepath.Join(dir, "home.nft")
	must(t, os.WriteFile(home, []byte(dropFragNeeded+fmt.Sprintf(`
table ip nat {
	chain prerouting_n { type nat hook prerouting priority dstnat; iifname "wan0" udp dport %[1]d dnat to %[2]s14:51820; }
	chain forward_m { type filter hook forward priority mangle; tcp flags syn tcp option maxseg size set %[3]d; }
	chain postrouting_n { type nat hook postrouting priority srcnat; oifname "wan0" ip saddr %[2]s0/24 meta l4proto udp masquerade to :20000-29999 random; oifname "wan0" ip saddr %[2]s0/24 masquerade; }
}
`, natForward, site.prefix, natUplinkMTU-40)), 0o644), "writing the home router's rules")
	testenv.Nft(t, r.ns, "-f", home)
	// The conntrack sysctls exist once the table above loaded conntrack.
	must(t, testenv.InNS(r.ns, func() error {
		s := strconv.Itoa(int(natUDPTimeout / time.Second))
		for _, k := range []string{"nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"} {
			if err := os.WriteFile("/proc/sys/net/netfilter/"+k, []byte(s), 0o644); err != nil {
				return err
			}
		}
		return nil
	}), "home router's UDP conntrack timeouts")
	testenv.MustIP(t, lab.host, "route", "add", site.public()+"/32", "via", site.ispLAN)
	for _, n := range lab.nodes {
		testenv.MustIP(t, n.NS, "route", "add", site.public()+"/32", "via", site.ispLAN)
	}
	return r
}

// siteNode attaches one more node to the home LAN (default route through
// the home router).
func (r *natRouter) siteNode(t *testing.T, lab *agentLab) *agentNode {
	n := lab.addNodeOn(r.site, r.prefix, 24)
	testenv.MustIP(t, n.NS, "route", "add", "default", "via", r.prefix+"1")
	return n
}

// mapping is the router's NAT port for node's WireGuard flow to peer (0:
// none).
func (r *natRouter) mapping(t *testing.T, node, peer string) int {
	var port int
	must(t, testenv.InNS(r.ns, func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			return err
		}
		for _, f := range flows {
			if f.Forward.Protocol == unix.IPPROTO_UDP && f.Forward.SrcIP.String() == node && f.Forward.SrcPort == 51820 &&
				f.Forward.DstIP.String() == peer {
				port = int(f.Reverse.DstPort)
			}
		}
		return nil
	}), "listing the router's conntrack table")
	return port
}

// flush is `conntrack -F` in the router: it forgets every mapping.
func (r *natRouter) flush(t *testing.T) {
	must(t, testenv.InNS(r.ns, func() error { return netlink.ConntrackTableFlush(netlink.ConntrackTable) }), "flushing the router's conntrack table")
}

// forget deletes the router's conntrack flows to dst (their NAT with
// them), leaving the others.
func (r *natRouter) forget(t *testing.T, dst string) {
	must(t, testenv.InNS(r.ns, func() error {
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(netlink.ConntrackOrigDstIP, net.ParseIP(dst)); err != nil {
			return err
		}
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
		return err
	}), "deleting the router's conntrack flows to %s", dst)
}

// dfSweep pings dst from pod with DF set at every size from the smallest
// IPv4 packet to mtu, one ping each (two tries), and returns the sizes
// (whole IP packets) that got no answer.
func dfSweep(t *testing.T, pod *Pod, dst string, mtu int) []int {
	script := `for s in $(seq 0 $1); do ping -M do -c 1 -W 2 -s $s $0 >/dev/null 2>&1 || ping -M do -c 1 -W 2 -s $s $0 >/dev/null 2>&1 || echo $s; done`
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(pod.NS.Path()), "sh", "-c", script, dst, strconv.Itoa(mtu-28)).CombinedOutput()
	must(t, err, "DF sweep to %s: %s", dst, out)
	var lost []int
	for _, f := range strings.Fields(string(out)) {
		n, err := strconv.Atoi(f)
		must(t, err, "DF sweep output %q", out)
		lost = append(lost, n+28)
	}
	return lost
}

// podMTU is the MTU of the pod's eth0.
func podMTU(t *testing.T, p *Pod) int {
	out := testenv.MustIP(t, p.NS, "link", "show", "eth0")
	m := regexp.MustCompile(` mtu (\d+) `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no MTU in %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestAgentWireGuardNAT(t *testing.T) {
	keyDir := t.TempDir()
	keyFile := filepath.Join(keyDir, "agt.key")
	wg := func(extra string) string {
		return fmt.Sprintf(`"wireguard":{"keyFile":%q,%s},`, keyFile, extra)
	}
	lab := newKubeLabOf(t, "wireguard", 2, func(conf string, _ *kubetest.Server) string {
		return strings.Replace(conf, `"vni":9,`, wg(fmt.Sprintf(`"persistentKeepalive":%d`, natKeepalive/time.Second)), 1)
	})
	lab.period = "1s"
	router := newNATRouter(t, lab.agentLab, home1)
	n3 := router.siteNode(t, lab.agentLab)
	n4 := router.siteNode(t, lab.agentLab)
	// node4: behind the port-forward, publishing it, never speaking first.
	b, err := os.ReadFile(lab.conf)
	must(t, err, "reading the conflist")
	n4.conf = filepath.Join(n4.Dir, "10-agt.conflist")
	own := strings.Replace(string(b), fmt.Sprintf(`"persistentKeepalive":%d`, natKeepalive/time.Second),
		fmt.Sprintf(`"persistentKeepalive":0,"endpoint":"%s:%d"`, natPublic, natForward), 1)
	must(t, os.WriteFile(n4.conf, []byte(own), 0o644), "writing node4's conflist")

	lab.startWireGuard(keyDir, nil)
	n1 := lab.nodes[0]
	var pods []*Pod
	for _, n := range lab.nodes {
		p := n.NewPod()
		n.MustAdd(lab.list, p)
		pods = append(pods, p)
	}
	p1, p3, p4 := pods[0], pods[2], pods[3]
	if m1, m3 := podMTU(t, p1), podMTU(t, p3); m1 != 1500-60 || m3 != 1500-60 {
		t.Fatalf("pod MTUs: %d on node1, %d on node3; want the underlay's 1500 less 60", m1, m3)
	}

	// Reachable with no prior traffic from node3's pods: node3's agent
	// handshakes through the NAT, node1 learns the NAT's port from it.
	capt := testenv.StartPcap(t, n1.NS, "lan0")
	waitFor(t, 30*time.Second, "pod on node1 -> pod on node3 (behind NAT)", func() (bool, string) {
		err := testenv.Ping(p1.NS, podIPv4(t, p3), 1)
		return err == nil, fmt.Sprint(err)
	})
	// node4 is reached at its published endpoint, the router's port-forward.
	waitFor(t, 30*time.Second, "pod on node1 -> pod on node4 (behind the port-forward)", func() (bool, string) {
		err := testenv.Ping(p1.NS, podIPv4(t, p4), 1)
		return err == nil, fmt.Sprint(err)
	})
	_, lines := capt.Stop()
	port := router.mapping(t, n3.ip, n1.ip)
	if port == 0 {
		t.Fatalf("the router has no NAT mapping of node3's WireGuard flow to node1")
	}
	toNAT := regexp.MustCompile(fmt.Sprintf(`IP %s\.51820 > %s\.%d: UDP`, regexp.QuoteMeta(n1.ip), regexp.QuoteMeta(natPublic), port))
	toForward := regexp.MustCompile(fmt.Sprintf(`IP %s\.51820 > %s\.%d: UDP`, regexp.QuoteMeta(n1.ip), regexp.QuoteMeta(natPublic), natForward))
	if !toNAT.MatchString(strings.Join(lines, "\n")) || !toForward.MatchString(strings.Join(lines, "\n")) {
		t.Fatalf("node1 sent nothing to node3's NAT mapping %s:%d or to node4's endpoint %s:%d:\n%s",
			natPublic, port, natPublic, natForward, strings.Join(lines, "\n"))
	}

	// Every size up to the pod MTU, DF set, through the uplink's smaller
	// MTU with ICMP "fragmentation needed" dropped: none vanishes (the
	// outer packets, DF clear, are fragmented at the uplink).
	for _, c := range []struct {
		from, to *Pod
		what     string
	}{{p1, p3, "node1 -> node3"}, {p3, p1, "node3 -> node1"}} {
		mtu := podMTU(t, c.from)
		began := time.Now()
		if lost := dfSweep(t, c.from, podIPv4(t, c.to), mtu); len(lost) > 0 {
			t.Errorf("DF ping sweep %s, 28-%d bytes: %d sizes got no answer: %v", c.what, mtu, len(lost), lost)
		} else {
			t.Logf("DF ping sweep %s: every size 28-%d bytes answered, in %v", c.what, mtu, time.Since(began).Round(time.Millisecond))
		}
	}

	// Idle longer than the NAT's UDP timeout, three times over: node3's
	// keepalives keep its mapping, and it is still reachable.
	idle := time.Now()
	waitFor(t, 60*time.Second, "node3's NAT mapping outlives 3 UDP timeouts", func() (bool, string) {
		p := router.mapping(t, n3.ip, n1.ip)
		if p != port {
			t.Fatalf("node3's NAT mapping changed while idle: port %d -> %d", port, p)
		}
		return time.Since(idle) > 3*natUDPTimeout, fmt.Sprintf("port %d after %v", p, time.Since(idle))
	})
	must(t, testenv.Ping(p1.NS, podIPv4(t, p3), 1), "pod on node1 -> pod on node3 after an idle of 3 NAT timeouts")

	// The NAT forgets everything: node3's next keepalive gets a new
	// mapping, and node1 answers there.
	capt = testenv.StartPcap(t, n1.NS, "lan0")
	router.flush(t)
	took := waitFor(t, natKeepalive+10*time.Second, "pod on node1 -> pod on node3 after conntrack -F", func() (bool, string) {
		err := testenv.Ping(p1.NS, podIPv4(t, p3), 1)
		return err == nil, fmt.Sprint(err)
	})
	_, lines = capt.Stop()
	newPort := router.mapping(t, n3.ip, n1.ip)
	t.Logf("after conntrack -F: node3 reachable again in %v (keepalive %v), NAT port %d -> %d", took.Round(time.Millisecond), natKeepalive, port, newPort)
	if newPort != port {
		toNew := regexp.MustCompile(fmt.Sprintf(`IP %s\.51820 > %s\.%d: UDP`, regexp.QuoteMeta(n1.ip), regexp.QuoteMeta(natPublic), newPort))
		if !toNew.MatchString(strings.Join(lines, "\n")) {
			t.Fatalf("node1 never sent to node3's new NAT mapping %s:%d:\n%s", natPublic, newPort, strings.Join(lines, "\n"))
		}
	}
}

// startWireGuard makes every node of lab a Node (podCIDR 10.70.<i>.0/24,
// the i-th node), its agent's key directory and UAPI directory of its own
// (wireGuardNode over keyDir), calls before (nil: nothing) once the Nodes
// exist, starts the agents and waits until each routes to every other
// node's subnet; it returns the subnets in the nodes' order.
func (lab *kubeLab) startWireGuard(keyDir string, before func()) []string {
	t := lab.t
	var subnets []string
	for i, n := range lab.nodes {
		subnets = append(subnets, fmt.Sprintf("10.70.%d.0/24", i+1))
		lab.createNode(n, subnets[i])
		wireGuardNode(t, n, keyDir)
	}
	if before != nil {
		before()
	}
	for _, n := range lab.nodes {
		lab.start(n)
	}
	for i, n := range lab.nodes {
		others := append(append([]string{}, subnets[:i]...), subnets[i+1:]...)
		waitFor(t, 60*time.Second, n.name+" routes to the other nodes", func() (bool, string) {
			return n.hasRoutes(t, others, nil)
		})
	}
	return subnets
}

// wireGuardNode runs n's agent with its own /var/run/wireguard (n.Dir/wgrun,
// for wgDevice) and its own key directory (n.Dir/wg) mounted over keyDir,
// the conflist's, as newWireGuardLab's nodes.
func wireGuardNode(t *testing.T, n *agentNode, keyDir string) {
	own, run := filepath.Join(n.Dir, "wg"), filepath.Join(n.Dir, "wgrun")
	must(t, os.MkdirAll(own, 0o700), "key directory of %s", n.name)
	must(t, os.MkdirAll(run, 0o755), "UAPI directory of %s", n.name)
	n.wrap = []string{"sh", "-ec", `mkdir -p /var/run/wireguard
mount --bind "$0" /var/run/wireguard
mount --bind "$1" "$2"
shift 2
exec "$@"`, run, own, keyDir}
}
