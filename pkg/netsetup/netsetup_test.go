package netsetup_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netsetup"
)

// in runs f on a thread inside n (a namespace the test made) and fails the
// test with whatever f returns. f must not call t.Fatal (other goroutine).
func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := testenv.InNS(n, f); err != nil {
		t.Fatal(err)
	}
}

func nsName(n ns.NetNS) string { return filepath.Base(n.Path()) }

// ipLink is the part of `ip -d -j link show` the tests read.
type ipLink struct {
	Index    int      `json:"ifindex"`
	Name     string   `json:"ifname"`
	Flags    []string `json:"flags"`
	MTU      int      `json:"mtu"`
	Master   string   `json:"master"`
	Address  string   `json:"address"`
	Alias    string   `json:"ifalias"`
	Promisc  int      `json:"promiscuity"`
	LinkInfo struct {
		Kind      string `json:"info_kind"`
		SlaveKind string `json:"info_slave_kind"`
		Data      struct {
			VlanFiltering int `json:"vlan_filtering"`
		} `json:"info_data"`
		SlaveData struct {
			Hairpin bool `json:"hairpin"`
		} `json:"info_slave_data"`
	} `json:"linkinfo"`
}

func (l ipLink) up() bool {
	for _, f := range l.Flags {
		if f == "UP" {
			return true
		}
	}
	return false
}

func link(t *testing.T, n ns.NetNS, name string) ipLink {
	t.Helper()
	out := testenv.MustIP(t, n, "-d", "-j", "link", "show", "dev", name)
	var ls []ipLink
	if err := json.Unmarshal([]byte(out), &ls); err != nil || len(ls) != 1 {
		t.Fatalf("parsing `ip -d -j link show dev %s`: %v: %s", name, err, out)
	}
	return ls[0]
}

func linkExists(n ns.NetNS, name string) bool {
	_, err := testenv.IP(n, "link", "show", "dev", name)
	return err == nil
}

func addrs(t *testing.T, n ns.NetNS, fam, dev string) string {
	t.Helper()
	return testenv.MustIP(t, n, fam, "-o", "addr", "show", "dev", dev)
}

func cidr(t *testing.T, s string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip // keep the host part: these are interface addresses
	return n
}

func ensureBridge(t *testing.T, node ns.NetNS, b netsetup.Bridge) *netlink.Bridge {
	t.Helper()
	var br *netlink.Bridge
	in(t, node, func() (err error) {
		br, err = netsetup.EnsureBridge(b)
		return err
	})
	return br
}

func openPod(t *testing.T, n ns.NetNS) *netsetup.Pod {
	t.Helper()
	p, err := netsetup.OpenPod(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestEnsureBridgeCreates(t *testing.T) {
	node := testenv.NewNS(t)
	br := ensureBridge(t, node, netsetup.Bridge{Name: "vbr0", MTU: 1400})
	if br == nil || br.Attrs().Index == 0 || br.Attrs().Name != "vbr0" {
		t.Fatalf("EnsureBridge returned %+v", br)
	}
	l := link(t, node, "vbr0")
	if l.LinkInfo.Kind != "bridge" || !l.up() || l.MTU != 1400 || l.Index != br.Attrs().Index {
		t.Fatalf("bridge as the kernel has it: kind=%q up=%v mtu=%d index=%d (returned index %d)", l.LinkInfo.Kind, l.up(), l.MTU, l.Index, br.Attrs().Index)
	}
	mac, err := net.ParseMAC(l.Address)
	if err != nil || mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
		t.Fatalf("bridge MAC %q: want a locally administered unicast address (%v)", l.Address, err)
	}
	if br.Attrs().HardwareAddr.String() != l.Address {
		t.Errorf("EnsureBridge returned MAC %v, kernel has %s", br.Attrs().HardwareAddr, l.Address)
	}
	// A port with a lower MAC comes and goes: without a MAC of its own the
	// bridge would take the port's, changing the pods' gateway MAC.
	testenv.MustIP(t, node, "link", "add", "pa", "mtu", "1400", "address", "00:00:00:00:00:01", "type", "veth", "peer", "name", "pb", "mtu", "1400")
	testenv.MustIP(t, node, "link", "set", "pa", "master", "vbr0", "up")
	testenv.MustIP(t, node, "link", "set", "pb", "up")
	if got := link(t, node, "vbr0"); got.Address != l.Address || got.MTU != 1400 {
		t.Errorf("with a port attached: bridge MAC %s MTU %d, want %s 1400", got.Address, got.MTU, l.Address)
	}
	testenv.MustIP(t, node, "link", "del", "pa")
	if got := link(t, node, "vbr0"); got.Address != l.Address || got.MTU != 1400 {
		t.Errorf("after the port left: bridge MAC %s MTU %d, want %s 1400", got.Address, got.MTU, l.Address)
	}
	// MTU 0 leaves the kernel default.
	ensureBridge(t, node, netsetup.Bridge{Name: "vbr1"})
	if got := link(t, node, "vbr1"); got.MTU != 1500 || !got.up() {
		t.Errorf("MTU 0 bridge: mtu %d up %v, want 1500 up", got.MTU, got.up())
	}
}

func TestEnsureBridgeReusesAndFixes(t *testing.T) {
	node := testenv.NewNS(t)
	first := ensureBridge(t, node, netsetup.Bridge{Name: "vbr0", MTU: 1400})
	mac := link(t, node, "vbr0").Address
	again := ensureBridge(t, node, netsetup.Bridge{Name: "vbr0", MTU: 1400})
	if again.Attrs().Index != first.Attrs().Index {
		t.Errorf("second EnsureBridge returned index %d, first %d", again.Attrs().Index, first.Attrs().Index)
	}
	// Drift is repaired; the MAC and index stay.
	testenv.MustIP(t, node, "link", "set", "vbr0", "down", "mtu", "1300")
	ensureBridge(t, node, netsetup.Bridge{Name: "vbr0", MTU: 1400, Promisc: true})
	l := link(t, node, "vbr0")
	if !l.up() || l.MTU != 1400 || l.Address != mac || l.Index != first.Attrs().Index {
		t.Errorf("after repair: up=%v mtu=%d mac=%s index=%d; want up 1400 %s %d", l.up(), l.MTU, l.Address, l.Index, mac, first.Attrs().Index)
	}
	if l.Promisc == 0 {
		t.Error("Promisc not turned on")
	}
	// An existing bridge someone else made is reused too.
	testenv.MustIP(t, node, "link", "add", "other0", "type", "bridge")
	o := ensureBridge(t, node, netsetup.Bridge{Name: "other0"})
	if o.Attrs().Index != link(t, node, "other0").Index || !link(t, node, "other0").up() {
		t.Error("pre-existing bridge not reused and brought up")
	}
}

// vlanFiltering reports whether the kernel can filter VLANs on a bridge
// (CONFIG_BRIDGE_VLAN_FILTERING), probed inside the test's own namespace.
func vlanFiltering(t *testing.T, n ns.NetNS) bool {
	t.Helper()
	if _, err := testenv.IP(n, "link", "add", "vlprobe0", "type", "bridge", "vlan_filtering", "1"); err != nil {
		t.Logf("kernel has no bridge VLAN filtering: %v", err)
		return false
	}
	testenv.MustIP(t, n, "link", "del", "vlprobe0")
	return true
}

// TestVlanFilteringRejectedWithoutKernelSupport: this kernel has no bridge
// VLAN filtering (README, Tests: not tested on this kernel), so what is
// tested is that asking for it fails cleanly, naming the bridge and the
// kernel option. On a kernel that has it, this test fails: replace it with
// one that checks vlan_filtering on a new and an existing bridge.
func TestVlanFilteringRejectedWithoutKernelSupport(t *testing.T) {
	node := testenv.NewNS(t)
	if vlanFiltering(t, node) {
		t.Fatal("this kernel filters VLANs on bridges: test the feature itself, not its rejection")
	}
	var err error
	in(t, node, func() error {
		_, err = netsetup.EnsureBridge(netsetup.Bridge{Name: "vbr0", VlanFiltering: true})
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "vbr0") || !strings.Contains(err.Error(), "CONFIG_BRIDGE_VLAN_FILTERING") {
		t.Errorf("VLAN filtering without kernel support: error %v, want one naming the bridge and the kernel option", err)
	}
}

func TestEnsureBridgeRefusesOtherKind(t *testing.T) {
	node := testenv.NewNS(t)
	testenv.MustIP(t, node, "link", "add", "vbr0", "type", "veth", "peer", "name", "vbr0p")
	var err error
	in(t, node, func() error { _, err = netsetup.EnsureBridge(netsetup.Bridge{Name: "vbr0"}); return nil })
	if err == nil {
		t.Fatal("EnsureBridge accepted a veth named like the bridge")
	}
	if !strings.Contains(err.Error(), `"vbr0"`) || !strings.Contains(err.Error(), "veth") || !strings.Contains(err.Error(), "not a bridge") {
		t.Errorf("error %q does not name the link and its kind", err)
	}
	if l := link(t, node, "vbr0"); l.LinkInfo.Kind != "veth" {
		t.Errorf("the foreign link was changed: kind %q", l.LinkInfo.Kind)
	}
}

func TestEnsureBridgeParallel(t *testing.T) {
	for round := range 5 {
		node := testenv.NewNS(t)
		name := fmt.Sprintf("vpar%d", round)
		const n = 8
		idx := make([]int, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = testenv.InNS(node, func() error {
					br, err := netsetup.EnsureBridge(netsetup.Bridge{Name: name, MTU: 1450})
					if err == nil {
						idx[i] = br.Attrs().Index
					}
					return err
				})
			}()
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Errorf("round %d goroutine %d: %v", round, i, errs[i])
			} else if idx[i] != idx[0] || idx[i] == 0 {
				t.Errorf("round %d: goroutine %d got bridge index %d, goroutine 0 got %d", round, i, idx[i], idx[0])
			}
		}
		out := testenv.MustIP(t, node, "-o", "link", "show", "type", "bridge")
		if c := strings.Count(strings.TrimSpace(out), "\n") + 1; c != 1 {
			t.Errorf("round %d: %d bridges after parallel EnsureBridge:\n%s", round, c, out)
		}
		if l := link(t, node, name); !l.up() || l.MTU != 1450 {
			t.Errorf("round %d: bridge up=%v mtu=%d", round, l.up(), l.MTU)
		}
	}
}

func TestEnsureGateway(t *testing.T) {
	node := testenv.NewNS(t)
	br := ensureBridge(t, node, netsetup.Bridge{Name: "vbr0"})
	gw := func(addr *net.IPNet, force bool) error {
		var err error
		in(t, node, func() error {
			err = netsetup.EnsureGateway(br, netsetup.GatewaySpec{Addr: addr, Force: force})
			return nil
		})
		return err
	}
	count := func(fam, want string) int {
		return strings.Count(addrs(t, node, fam, "vbr0"), " "+want+" ")
	}

	if err := gw(cidr(t, "10.1.0.1/24"), false); err != nil {
		t.Fatal(err)
	}
	if err := gw(cidr(t, "10.1.0.1/24"), false); err != nil {
		t.Fatalf("repeat: %v", err)
	}
	// Same address, 16-byte IPv4 form: still the same gateway.
	if err := gw(&net.IPNet{IP: net.ParseIP("10.1.0.1"), Mask: net.CIDRMask(24, 32)}, false); err != nil {
		t.Fatalf("repeat with 16-byte IP: %v", err)
	}
	if c := count("-4", "10.1.0.1/24"); c != 1 {
		t.Fatalf("10.1.0.1/24 present %d times:\n%s", c, addrs(t, node, "-4", "vbr0"))
	}

	err := gw(cidr(t, "10.2.0.1/24"), false)
	if err == nil || !strings.Contains(err.Error(), "10.1.0.1/24") || !strings.Contains(err.Error(), "10.2.0.1/24") {
		t.Fatalf("conflicting IPv4 gateway: error %v, want one naming both addresses", err)
	}
	if count("-4", "10.2.0.1/24") != 0 || count("-4", "10.1.0.1/24") != 1 {
		t.Fatalf("a refused gateway changed the bridge:\n%s", addrs(t, node, "-4", "vbr0"))
	}
	// Same IP, other prefix length is a different address too.
	if err := gw(cidr(t, "10.1.0.1/16"), false); err == nil {
		t.Error("10.1.0.1/16 accepted next to 10.1.0.1/24")
	}

	// IPv6: non-overlapping subnets coexist; the v4 address is untouched.
	if err := gw(cidr(t, "fd00:1::1/64"), false); err != nil {
		t.Fatal(err)
	}
	if err := gw(cidr(t, "fd00:2::1/64"), false); err != nil {
		t.Fatalf("second, non-overlapping IPv6 gateway: %v", err)
	}
	if err := gw(cidr(t, "fd00:2::1/64"), false); err != nil {
		t.Fatalf("repeat IPv6: %v", err)
	}
	if count("-6", "fd00:1::1/64") != 1 || count("-6", "fd00:2::1/64") != 1 {
		t.Fatalf("IPv6 gateways:\n%s", addrs(t, node, "-6", "vbr0"))
	}
	for _, line := range strings.Split(addrs(t, node, "-6", "vbr0"), "\n") {
		if strings.Contains(line, "fd00:") && strings.Contains(line, "tentative") {
			t.Errorf("gateway address is tentative (DAD not skipped): %s", line)
		}
	}
	err = gw(cidr(t, "fd00:1::2/64"), false)
	if err == nil || !strings.Contains(err.Error(), "fd00:1::1/64") || !strings.Contains(err.Error(), "fd00:1::2/64") {
		t.Errorf("overlapping IPv6 gateway: error %v, want one naming both", err)
	}

	// Force replaces the conflicting address of that family only.
	if err := gw(cidr(t, "10.2.0.1/24"), true); err != nil {
		t.Fatalf("Force: %v", err)
	}
	if count("-4", "10.1.0.1/24") != 0 || count("-4", "10.2.0.1/24") != 1 {
		t.Errorf("after Force:\n%s", addrs(t, node, "-4", "vbr0"))
	}
	if err := gw(cidr(t, "fd00:1::2/64"), true); err != nil {
		t.Fatalf("Force IPv6: %v", err)
	}
	v6 := addrs(t, node, "-6", "vbr0")
	if strings.Contains(v6, "fd00:1::1/64") || !strings.Contains(v6, "fd00:1::2/64") || !strings.Contains(v6, "fd00:2::1/64") {
		t.Errorf("after IPv6 Force (want fd00:1::2 and fd00:2::1 only):\n%s", v6)
	}
	if !strings.Contains(addrs(t, node, "-4", "vbr0"), "10.2.0.1/24") {
		t.Error("IPv6 Force removed the IPv4 gateway")
	}
}

type podEnv struct {
	node, podNS ns.NetNS
	pod         *netsetup.Pod
	br          *netlink.Bridge
}

func newPodEnv(t *testing.T, b netsetup.Bridge) *podEnv {
	e := &podEnv{node: testenv.NewNS(t), podNS: testenv.NewNS(t)}
	e.br = ensureBridge(t, e.node, b)
	e.pod = openPod(t, e.podNS)
	return e
}

func (e *podEnv) veth(t *testing.T, v netsetup.Veth) (*netsetup.VethLinks, error) {
	t.Helper()
	if v.Pod == nil {
		v.Pod = e.pod
	}
	if v.Bridge == nil {
		v.Bridge = e.br
	}
	var links *netsetup.VethLinks
	var err error
	in(t, e.node, func() error { links, err = netsetup.EnsureVeth(v); return nil })
	return links, err
}

func TestEnsureVeth(t *testing.T) {
	e := newPodEnv(t, netsetup.Bridge{Name: "vbr0", MTU: 1400})
	mac, _ := net.ParseMAC("0a:58:0a:f4:01:05")
	spec := netsetup.Veth{ContainerID: "c1", IfName: "eth0", MTU: 1400, MAC: mac, Hairpin: true}
	links, err := e.veth(t, spec)
	if err != nil {
		t.Fatal(err)
	}
	hostName := netsetup.HostVethName("c1", "eth0")
	if !links.Created || links.Host.Attrs().Name != hostName || links.Pod.Attrs().Name != "eth0" {
		t.Fatalf("EnsureVeth = Created %v host %q pod %q", links.Created, links.Host.Attrs().Name, links.Pod.Attrs().Name)
	}

	h := link(t, e.node, hostName)
	if h.LinkInfo.Kind != "veth" || h.Master != "vbr0" || !h.up() || h.MTU != 1400 {
		t.Errorf("host end: kind %q master %q up %v mtu %d", h.LinkInfo.Kind, h.Master, h.up(), h.MTU)
	}
	if !h.LinkInfo.SlaveData.Hairpin {
		t.Error("hairpin is off on the host port")
	}
	p := link(t, e.podNS, "eth0")
	if p.LinkInfo.Kind != "veth" || p.MTU != 1400 || p.Address != "0a:58:0a:f4:01:05" || p.Alias != "village/c1" {
		t.Errorf("pod end: kind %q mtu %d mac %s alias %q", p.LinkInfo.Kind, p.MTU, p.Address, p.Alias)
	}
	if linkExists(e.node, "eth0") {
		t.Error("a link named eth0 appeared on the node")
	}
	if linkExists(e.podNS, hostName) {
		t.Error("the host end is in the pod")
	}

	// Same container again: adopted, nothing new made.
	again, err := e.veth(t, spec)
	if err != nil {
		t.Fatalf("repeat: %v", err)
	}
	if again.Created || again.Host.Attrs().Index != links.Host.Attrs().Index || again.Pod.Attrs().Index != links.Pod.Attrs().Index {
		t.Errorf("repeat: Created %v host %d/%d pod %d/%d", again.Created, again.Host.Attrs().Index, links.Host.Attrs().Index, again.Pod.Attrs().Index, links.Pod.Attrs().Index)
	}

	// Another container, same ifname in the same netns: refused, no debris.
	other := spec
	other.ContainerID = "c2"
	if _, err := e.veth(t, other); err == nil || !strings.Contains(err.Error(), "eth0") || !strings.Contains(err.Error(), "c2") {
		t.Errorf("other container's eth0: error %v, want one naming eth0 and c2", err)
	}
	if linkExists(e.node, netsetup.HostVethName("c2", "eth0")) {
		t.Error("refused EnsureVeth left a host veth behind")
	}
	if got := link(t, e.podNS, "eth0"); got.Alias != "village/c1" || got.Index != p.Index {
		t.Error("refused EnsureVeth changed the existing eth0")
	}
}

// TestVethVlanRejectedWithoutKernelSupport: without bridge VLAN filtering
// (this kernel; README, Tests: not tested on this kernel) a pod asking for a
// VLAN fails naming the VLAN and the host veth, and the pair made before is
// gone. On a kernel that filters VLANs this test fails: replace it with one
// that checks the port's PVID and untagged flags.
func TestVethVlanRejectedWithoutKernelSupport(t *testing.T) {
	node := testenv.NewNS(t)
	if vlanFiltering(t, node) {
		t.Fatal("this kernel filters VLANs on bridges: test the feature itself, not its rejection")
	}
	e := &podEnv{node: node, podNS: testenv.NewNS(t)}
	e.pod = openPod(t, e.podNS)
	e.br = ensureBridge(t, node, netsetup.Bridge{Name: "vbr0"})
	hostName := netsetup.HostVethName("c1", "eth0")
	_, err := e.veth(t, netsetup.Veth{ContainerID: "c1", IfName: "eth0", Vlan: 100, Hairpin: true})
	if err == nil || !strings.Contains(err.Error(), "VLAN 100") || !strings.Contains(err.Error(), hostName) {
		t.Errorf("VLAN without kernel support: error %v, want one naming VLAN 100 and %s", err, hostName)
	}
	if linkExists(node, hostName) || linkExists(e.podNS, "eth0") {
		t.Error("failed EnsureVeth left its veth pair behind")
	}
}

func TestEnsureVethNoHairpinNoVlan(t *testing.T) {
	e := newPodEnv(t, netsetup.Bridge{Name: "vbr0"})
	links, err := e.veth(t, netsetup.Veth{ContainerID: "c1", IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	h := link(t, e.node, links.Host.Attrs().Name)
	if h.LinkInfo.SlaveData.Hairpin || h.MTU != 1500 || h.Master != "vbr0" {
		t.Errorf("host end: hairpin %v mtu %d master %q", h.LinkInfo.SlaveData.Hairpin, h.MTU, h.Master)
	}
	if p := link(t, e.podNS, "eth0"); p.MTU != 1500 || p.Alias != "village/c1" {
		t.Errorf("pod end: mtu %d alias %q", p.MTU, p.Alias)
	}
}

func TestEnsureVethForeignInterface(t *testing.T) {
	e := newPodEnv(t, netsetup.Bridge{Name: "vbr0"})
	testenv.MustIP(t, e.podNS, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
	before := link(t, e.podNS, "eth0")
	_, err := e.veth(t, netsetup.Veth{ContainerID: "c1", IfName: "eth0"})
	if err == nil || !strings.Contains(err.Error(), "eth0") {
		t.Fatalf("foreign eth0: error %v, want one naming eth0", err)
	}
	if after := link(t, e.podNS, "eth0"); after.Index != before.Index || after.Alias != "" {
		t.Error("the foreign eth0 was changed")
	}
	if linkExists(e.node, netsetup.HostVethName("c1", "eth0")) {
		t.Error("refused EnsureVeth left a host veth behind")
	}
	// A non-veth eth0 is foreign as well.
	testenv.MustIP(t, e.podNS, "link", "add", "net1", "type", "bridge")
	if _, err := e.veth(t, netsetup.Veth{ContainerID: "c1", IfName: "net1"}); err == nil {
		t.Error("a bridge named net1 in the pod was adopted")
	}
}

func TestEnsureVethRemovesStaleHostEnd(t *testing.T) {
	e := newPodEnv(t, netsetup.Bridge{Name: "vbr0"})
	hostName := netsetup.HostVethName("c9", "eth0")
	// Debris of an interrupted ADD: our host end exists, the pod end does not.
	testenv.MustIP(t, e.node, "link", "add", hostName, "type", "veth", "peer", "name", "junk0")
	links, err := e.veth(t, netsetup.Veth{ContainerID: "c9", IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	if !links.Created || link(t, e.node, hostName).Master != "vbr0" || linkExists(e.node, "junk0") {
		t.Error("stale host veth not replaced by a fresh pair")
	}
}

func TestConfigurePod(t *testing.T) {
	e := newPodEnv(t, netsetup.Bridge{Name: "vbr0", MTU: 1400})
	for _, g := range []string{"10.1.0.1/24", "fd00:1::1/64"} {
		in(t, e.node, func() error { return netsetup.EnsureGateway(e.br, netsetup.GatewaySpec{Addr: cidr(t, g)}) })
	}
	links, err := e.veth(t, netsetup.Veth{ContainerID: "c1", IfName: "eth0", MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	_, def4, _ := net.ParseCIDR("0.0.0.0/0")
	_, def6, _ := net.ParseCIDR("::/0")
	_, onlink, _ := net.ParseCIDR("192.168.77.0/24")
	iface := netsetup.PodIface{
		Link:  links.Pod,
		Addrs: []netsetup.PodAddr{{Addr: cidr(t, "10.1.0.5/24")}, {Addr: cidr(t, "fd00:1::5/64")}},
		Routes: []netsetup.PodRoute{
			{Dst: def4, GW: net.ParseIP("10.1.0.1")},
			{Dst: def6, GW: net.ParseIP("fd00:1::1")},
			{Dst: onlink},
			{Dst: cidr(t, "172.16.0.0/16"), GW: net.ParseIP("10.1.0.1"), MTU: 1300},
		},
	}
	if err := e.pod.ConfigurePod(iface); err != nil {
		t.Fatal(err)
	}
	// Checked right away: the IPv6 address must be usable immediately.
	v6 := addrs(t, e.podNS, "-6", "eth0")
	if !strings.Contains(v6, "fd00:1::5/64") {
		t.Fatalf("IPv6 address missing:\n%s", v6)
	}
	for _, line := range strings.Split(v6, "\n") {
		if strings.Contains(line, "fd00:1::5/64") && (strings.Contains(line, "tentative") || strings.Contains(line, "dadfailed")) {
			t.Errorf("pod IPv6 address not usable right after ConfigurePod: %s", line)
		}
	}
	if v4 := addrs(t, e.podNS, "-4", "eth0"); !strings.Contains(v4, "10.1.0.5/24") {
		t.Errorf("IPv4 address missing:\n%s", v4)
	}
	if !link(t, e.podNS, "eth0").up() {
		t.Error("eth0 is not up")
	}
	r4 := testenv.MustIP(t, e.podNS, "-4", "route", "show")
	for _, want := range []string{"default via 10.1.0.1 dev eth0", "192.168.77.0/24 dev eth0 scope link", "172.16.0.0/16 via 10.1.0.1 dev eth0 mtu 1300"} {
		if !strings.Contains(r4, want) {
			t.Errorf("IPv4 routes lack %q:\n%s", want, r4)
		}
	}
	if r6 := testenv.MustIP(t, e.podNS, "-6", "route", "show"); !strings.Contains(r6, "default via fd00:1::1 dev eth0") {
		t.Errorf("IPv6 routes lack the default route:\n%s", r6)
	}
	// Repeats are harmless and add nothing.
	if err := e.pod.ConfigurePod(iface); err != nil {
		t.Fatalf("repeat: %v", err)
	}
	if c := strings.Count(addrs(t, e.podNS, "-4", "eth0"), "10.1.0.5/24"); c != 1 {
		t.Errorf("10.1.0.5/24 present %d times after repeat", c)
	}
	// The pod reaches its gateway on both families (traffic stays between
	// the two namespaces this test made).
	for _, dst := range []string{"10.1.0.1", "fd00:1::1"} {
		if err := testenv.Ping(e.podNS, dst, 3); err != nil {
			t.Error(err)
		}
	}
}

func TestOpenPod(t *testing.T) {
	node := testenv.NewNS(t)
	podNS := testenv.NewNS(t)

	var err error
	in(t, node, func() error {
		var p *netsetup.Pod
		p, err = netsetup.OpenPod(node.Path())
		p.Close()
		return nil
	})
	if !errors.Is(err, netsetup.ErrHostNetNS) {
		t.Errorf("OpenPod(own netns) = %v, want ErrHostNetNS", err)
	}

	file := filepath.Join(t.TempDir(), "not-a-netns")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = netsetup.OpenPod(file)
	var notNS ns.NSPathNotNSErr
	if !errors.As(err, &notNS) || !strings.Contains(err.Error(), file) {
		t.Errorf("OpenPod(regular file) = %v, want NSPathNotNSErr naming the file", err)
	}
	_, err = netsetup.OpenPod(file + ".missing")
	var missing ns.NSPathNotExistErr
	if !errors.As(err, &missing) {
		t.Errorf("OpenPod(missing path) = %v, want NSPathNotExistErr", err)
	}

	in(t, node, func() error {
		p, err := netsetup.OpenPod(podNS.Path())
		if err != nil {
			return err
		}
		defer p.Close()
		if p.Path != podNS.Path() || p.Handle() == nil || p.NS().Path() != podNS.Path() {
			return fmt.Errorf("OpenPod returned %+v", p)
		}
		if l, err := p.LinkByName("lo"); err != nil || l == nil {
			return fmt.Errorf("LinkByName(lo) in pod = %v, %v", l, err)
		}
		if l, err := p.LinkByName("nope0"); err != nil || l != nil {
			return fmt.Errorf("LinkByName(missing) = %v, %v; want nil, nil", l, err)
		}
		return nil
	})
	var nilPod *netsetup.Pod
	nilPod.Close() // must not panic
}

func TestDeleteLinks(t *testing.T) {
	e := newPodEnv(t, netsetup.Bridge{Name: "vbr0"})
	if err := e.pod.DeleteLink("nope0"); err != nil {
		t.Errorf("DeleteLink(missing) = %v", err)
	}
	in(t, e.node, func() error { return netsetup.DeleteHostLink("nope0") })

	links, err := e.veth(t, netsetup.Veth{ContainerID: "c1", IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	hostName := links.Host.Attrs().Name
	if err := e.pod.DeleteLink("eth0"); err != nil {
		t.Fatal(err)
	}
	if linkExists(e.podNS, "eth0") || linkExists(e.node, hostName) {
		t.Error("deleting the pod end left one end of the pair")
	}
	if err := e.pod.DeleteLink("eth0"); err != nil {
		t.Errorf("second DeleteLink = %v", err)
	}
	in(t, e.node, func() error { return netsetup.DeleteHostLink(hostName) })

	// DeleteHostLink removes an existing node link.
	if _, err := e.veth(t, netsetup.Veth{ContainerID: "c2", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	h2 := netsetup.HostVethName("c2", "eth0")
	in(t, e.node, func() error { return netsetup.DeleteHostLink(h2) })
	if linkExists(e.node, h2) || linkExists(e.podNS, "eth0") {
		t.Error("DeleteHostLink left the pair in place")
	}
}

func TestHostVethName(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"c1", "c2", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", strings.Repeat("x", 1000), "a.b_c-d"} {
		for _, ifn := range []string{"eth0", "net1"} {
			n := netsetup.HostVethName(id, ifn)
			if n != netsetup.HostVethName(id, ifn) {
				t.Errorf("HostVethName(%q, %q) not deterministic", id, ifn)
			}
			if len(n) > 15 || !strings.HasPrefix(n, "veth") || strings.ContainsAny(n, "/: \x00") {
				t.Errorf("HostVethName(%q, %q) = %q: not a valid interface name", id, ifn, n)
			}
			key := id + "/" + ifn
			if prev, dup := seen[n]; dup {
				t.Errorf("HostVethName collision: %q and %q both give %q", prev, key, n)
			}
			seen[n] = key
		}
	}
}
