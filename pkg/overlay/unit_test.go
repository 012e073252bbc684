package overlay

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestDeriveMAC(t *testing.T) {
	if got := DeriveMAC(net.ParseIP("192.168.77.12")).String(); got != "0e:76:c0:a8:4d:0c" {
		t.Errorf("DeriveMAC(192.168.77.12) = %s", got)
	}
	for _, s := range []string{"10.0.0.1", "fd77::12", "2001:db8::1"} {
		ip := net.ParseIP(s)
		m := DeriveMAC(ip)
		if len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
			t.Errorf("DeriveMAC(%s) = %s: want a 6-byte locally administered unicast MAC", s, m)
		}
		if DeriveMAC(net.ParseIP(s)).String() != m.String() {
			t.Errorf("DeriveMAC(%s) is not stable", s)
		}
	}
	if DeriveMAC(net.ParseIP("fd77::12")).String() == DeriveMAC(net.ParseIP("fd77::13")).String() {
		t.Error("two IPv6 addresses got one MAC")
	}
}

func TestOverheadAndDeviceName(t *testing.T) {
	if Overhead(net.ParseIP("192.0.2.1")) != 50 || Overhead(net.ParseIP("2001:db8::1")) != 70 {
		t.Error("overhead: want 50 for IPv4, 70 for IPv6")
	}
	if DeviceName(42) != "village.42" {
		t.Error(DeviceName(42))
	}
}

func TestConfigNormalize(t *testing.T) {
	c, err := Config{Mode: ModeVXLAN}.normalize()
	if err != nil || c.VNI != 1 || c.Port != 4789 {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	for _, bad := range []Config{
		{Mode: "bgp"}, {Mode: ModeVXLAN, VNI: 1 << 24}, {Mode: ModeVXLAN, Port: 70000},
		{Mode: ModeVXLAN, VNI: 16000000, Underlay: "x"},
	} {
		if _, err := bad.normalize(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err %v, want ErrConfig", bad, err)
		}
	}
}

// testEnv is an underlay eth0 with 192.168.77.11/24 and fd77::11/64.
func testEnv() env {
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Index: 2, MTU: 1500}}
	addr := func(s string) netlink.Addr {
		ip, n, _ := net.ParseCIDR(s)
		n.IP = ip
		return netlink.Addr{IPNet: n}
	}
	return env{
		u:    underlay{link: link, ip: net.ParseIP("192.168.77.11").To4(), addrs: []netlink.Addr{addr("192.168.77.11/24"), addr("fd77::11/64")}},
		vtep: linkRef{index: 9, name: "village.1"},
	}
}

func node(name, ip string, cidrs ...string) Node {
	n := Node{Name: name, IP: net.ParseIP(ip)}
	for _, c := range cidrs {
		_, p, _ := net.ParseCIDR(c)
		n.PodCIDRs = append(n.PodCIDRs, p)
	}
	return n
}

func routeDescs(d desired) []string {
	var out []string
	for _, k := range sortedKeys(d.routes) {
		out = append(out, d.routes[k].object().Desc)
	}
	return out
}

func TestPlanBackends(t *testing.T) {
	self := node("a", "192.168.77.11", "10.244.1.0/24")
	peers := []Node{
		node("c", "10.9.0.3", "10.244.3.0/24"),
		node("b", "192.168.77.12", "10.244.2.0/24", "fd44:2::/64"),
		node("a", "192.168.77.11", "10.244.1.0/24"), // self: skipped
	}
	want := map[Mode][]string{
		ModeVXLAN: {
			"10.244.2.0/24 via 10.244.2.0 dev village.1 onlink",
			"10.244.3.0/24 via 10.244.3.0 dev village.1 onlink",
			"fd44:2::/64 via fd44:2:: dev village.1 onlink",
		},
		ModeAuto: {
			"10.244.2.0/24 via 192.168.77.12 dev eth0",
			"10.244.3.0/24 via 10.244.3.0 dev village.1 onlink",
			"fd44:2::/64 via fd44:2:: dev village.1 onlink",
		},
	}
	for mode, w := range want {
		d, problems := plan(backendFor(mode), testEnv(), self, peers)
		if len(problems) != 0 {
			t.Errorf("%s: problems %v", mode, problems)
		}
		if got := routeDescs(d); !slices.Equal(got, w) {
			t.Errorf("%s routes:\n%q\nwant\n%q", mode, got, w)
		}
	}
	d, problems := plan(backendFor(ModeHostGW), testEnv(), self, peers)
	if len(problems) != 2 || !errors.Is(problems[0].Err, ErrFamily) || !errors.Is(problems[1].Err, ErrOffSubnet) ||
		!strings.Contains(problems[1].Err.Error(), "peer c") {
		t.Errorf("host-gw problems: %v", problems)
	}
	if got := routeDescs(d); !slices.Equal(got, []string{"10.244.2.0/24 via 192.168.77.12 dev eth0"}) {
		t.Errorf("host-gw routes %q", got)
	}
	if !d.held["route|10.244.3.0/24"] || !d.held["route|fd44:2::/64"] {
		t.Errorf("unplannable subnets not held: %v", d.held)
	}
}

func TestPlanConflictsAreOrderIndependent(t *testing.T) {
	self := node("a", "192.168.77.11", "10.244.1.0/24")
	peers := []Node{
		node("b", "192.168.77.12", "10.244.2.0/24"),
		node("c", "192.168.77.13", "10.244.2.0/24"), // b's subnet
		node("d", "192.168.77.14", "10.244.1.0/24"), // self's subnet
		node("e", "192.168.77.12", "10.244.5.0/24"), // b's address, so b's MAC
		node("b", "192.168.77.15", "10.244.6.0/24"), // b twice
		{Name: "", IP: net.ParseIP("192.168.77.16")},
	}
	var first string
	for i := range 6 {
		in := append(slices.Clone(peers[i:]), peers[:i]...)
		d, problems := plan(backendFor(ModeVXLAN), testEnv(), self, in)
		if len(problems) != 5 {
			t.Fatalf("rotation %d: problems %v", i, problems)
		}
		for _, p := range problems {
			if !errors.Is(p.Err, ErrConflict) && !errors.Is(p.Err, ErrConfig) {
				t.Errorf("problem %v is neither a conflict nor a config error", p.Err)
			}
		}
		got := strings.Join(routeDescs(d), "|")
		if first == "" {
			first = got
		} else if got != first {
			t.Errorf("rotation %d planned %s, rotation 0 %s", i, got, first)
		}
	}
}

func TestCanonical(t *testing.T) {
	_, c, _ := net.ParseCIDR("10.1.2.3/24")
	c.IP = net.ParseIP("10.1.2.3") // 16-byte form with host bits
	if got := canonical(c).String(); got != "10.1.2.0/24" || len(canonical(c).IP) != 4 {
		t.Errorf("canonical = %s", got)
	}
	if got := vtepAddr(canonical(c)).String(); got != "10.1.2.0/32" {
		t.Errorf("vtepAddr = %s", got)
	}
	_, c6, _ := net.ParseCIDR("fd44:2::/64")
	if got := vtepAddr(canonical(c6)).String(); got != "fd44:2::/128" {
		t.Errorf("vtepAddr = %s", got)
	}
}
