package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/village-cni/village/internal/testenv"
)

// sharedNet is one Village network of a node that runs several.
type sharedNet struct {
	name, mode string
	vni        int
	octet      int // pod subnets 10.<octet>.<node>.0/24 and fd00:<octet>:0:<node>::/64
	bridge     string
	refused    bool   // its VXLAN device is another network's (same VNI)
	conf       string // conflist file (for villaged)
	list       *libcni.NetworkConfigList
}

func (s *sharedNet) v6() bool { return s.mode == "vxlan" || s.mode == "auto" }

func (s *sharedNet) subnet(node int) string { return fmt.Sprintf("10.%d.%d.0/24", s.octet, node) }

func (s *sharedNet) subnet6(node int) string { return fmt.Sprintf("fd00:%d:0:%d::/64", s.octet, node) }

// vtep is the network's VXLAN device, "" when it has none.
func (s *sharedNet) vtep() string {
	if (s.mode == "vxlan" || s.mode == "auto") && !s.refused {
		return fmt.Sprintf("village.%d", s.vni)
	}
	return ""
}

// write makes the network's conflist for node 1 of nodes (static peers: the
// others).
func (s *sharedNet) write(t *testing.T, nodes []*clusterNode) {
	var peers []string
	for i, p := range nodes[1:] {
		cidrs := fmt.Sprintf("%q", s.subnet(i+2))
		if s.v6() {
			cidrs += fmt.Sprintf(",%q", s.subnet6(i+2))
		}
		peers = append(peers, fmt.Sprintf(`{"name":"node%d","ip":%q,"podCIDRs":[%s]}`, i+2, p.ip, cidrs))
	}
	ranges := fmt.Sprintf(`[{"subnet":%q}]`, s.subnet(1))
	if s.v6() {
		ranges += fmt.Sprintf(`,[{"subnet":%q}]`, s.subnet6(1))
	}
	text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":%q,"isDefaultGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[%s]},
		"backend":{"type":%q,"underlay":"lan0","vni":%d,"nodes":[%s]}}]}`,
		s.name, s.bridge, filepath.Join(nodes[0].Dir, "ipam-"+s.name), ranges, s.mode, s.vni, strings.Join(peers, ","))
	s.conf = filepath.Join(nodes[0].Dir, s.name+".conflist")
	must(t, os.WriteFile(s.conf, []byte(text), 0o644), "writing %s", s.conf)
	s.list = ConfList(t, text)
}

// netDump is what the kernel of a node holds for one network, read without
// Village's own idea of ownership: every route (any table, protocol and
// metric) into the network's pod subnets, its bridge and VXLAN device
// (index, MAC, MTU, alias, VXLAN id), and the permanent neighbour and FDB
// entries on that device.
type netDump struct {
	Routes []string
	Links  []string
	Neighs []string
	FDB    []string
}

func (d netDump) String() string {
	b, _ := json.MarshalIndent(d, "", "  ")
	return string(b)
}

// flat is every line of the dump, for looking things up.
func (d netDump) flat() string {
	return strings.Join(append(append(append(append([]string{}, d.Routes...), d.Links...), d.Neighs...), d.FDB...), "\n")
}

func dumpNet(t *testing.T, n *Node, s *sharedNet) netDump {
	t.Helper()
	var d netDump
	for _, fam := range []string{"-4", "-6"} {
		for _, line := range strings.Split(testenv.MustIP(t, n.NS, fam, "route", "show", "table", "all"), "\n") {
			if strings.HasPrefix(line, fmt.Sprintf("10.%d.", s.octet)) || strings.HasPrefix(line, fmt.Sprintf("fd00:%d:", s.octet)) {
				d.Routes = append(d.Routes, strings.TrimSpace(line))
			}
		}
	}
	for _, dev := range []string{s.bridge, s.vtep()} {
		if dev == "" {
			continue
		}
		out, err := testenv.IP(n.NS, "-j", "-d", "link", "show", "dev", dev)
		if err != nil {
			continue // absent: the dump says so by not listing it
		}
		var links []struct {
			Index int    `json:"ifindex"`
			Name  string `json:"ifname"`
			MAC   string `json:"address"`
			MTU   int    `json:"mtu"`
			Alias string `json:"ifalias"`
			Info  struct {
				Kind string          `json:"info_kind"`
				Data json.RawMessage `json:"info_data"`
			} `json:"linkinfo"`
		}
		if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
			t.Fatalf("ip -j link show dev %s: %v: %s", dev, err, out)
		}
		l := links[0]
		data := ""
		if l.Info.Kind == "vxlan" {
			var v struct {
				ID    int    `json:"id"`
				Port  int    `json:"port"`
				Local string `json:"local"`
			}
			_ = json.Unmarshal(l.Info.Data, &v)
			data = fmt.Sprintf(" id %d port %d local %s", v.ID, v.Port, v.Local)
		}
		d.Links = append(d.Links, fmt.Sprintf("%d %s %s %s mtu %d alias %q%s", l.Index, l.Name, l.Info.Kind, l.MAC, l.MTU, l.Alias, data))
		if l.Info.Kind != "vxlan" {
			continue
		}
		for _, line := range strings.Split(testenv.MustIP(t, n.NS, "neigh", "show", "dev", dev, "nud", "permanent"), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				d.Neighs = append(d.Neighs, line)
			}
		}
		out2, err := exec.Command("ip", "netns", "exec", n.Name(), "bridge", "fdb", "show", "dev", dev).CombinedOutput()
		if err != nil {
			t.Fatalf("bridge fdb show dev %s: %v: %s", dev, err, out2)
		}
		for _, line := range strings.Split(string(out2), "\n") {
			if strings.Contains(line, "permanent") && strings.Contains(line, " dst ") {
				d.FDB = append(d.FDB, strings.TrimSpace(line))
			}
		}
	}
	return d
}

// TestNetworksShareANode runs four Village networks on one node: vxlan
// (VNI 7), host-gw (also VNI 7), auto (VNI 8) and none (VNI 7), and a fifth
// vxlan network that asks for VNI 7 again. Through ADD, CHECK and DEL of
// each network's pods, villaged sync of each, and villaged run of the none
// network (whose start pass is a sweep), the kernel objects of every other
// network stay exactly as they were (dump before and after each step); the
// second VNI 7 vxlan network is refused with a conflict and changes nothing.
func TestNetworksShareANode(t *testing.T) {
	nodes := staticCluster(t)
	n1 := nodes[0]
	vx := &sharedNet{name: "net-vx", mode: "vxlan", vni: 7, octet: 61, bridge: "vlg-vx"}
	gw := &sharedNet{name: "net-gw", mode: "host-gw", vni: 7, octet: 62, bridge: "vlg-gw"}
	au := &sharedNet{name: "net-auto", mode: "auto", vni: 8, octet: 63, bridge: "vlg-auto"}
	no := &sharedNet{name: "net-none", mode: "none", vni: 7, octet: 64, bridge: "vlg-none"}
	dup := &sharedNet{name: "net-dup", mode: "vxlan", vni: 7, octet: 65, bridge: "vlg-dup", refused: true}
	nets := []*sharedNet{vx, gw, au, no, dup}
	for _, s := range nets {
		s.write(t, nodes)
	}

	// others runs step (an action of network self) and proves that no other
	// network's objects changed; each dump must first hold what the network
	// is known to have by then (so an empty dump, or a wrong device name,
	// cannot pass).
	expect := map[*sharedNet][]string{}
	others := func(self *sharedNet, what string, step func()) {
		t.Helper()
		before := map[*sharedNet]netDump{}
		for _, s := range nets {
			if s == self {
				continue
			}
			d := dumpNet(t, n1.Node, s)
			for _, want := range expect[s] {
				if !strings.Contains(d.flat(), want) {
					t.Fatalf("%s: before it, network %s lacks %q:\n%s", what, s.name, want, d)
				}
			}
			before[s] = d
		}
		step()
		for s, b := range before {
			if a := dumpNet(t, n1.Node, s); a.String() != b.String() {
				t.Fatalf("%s changed network %s:\nbefore %s\nafter %s", what, s.name, b, a)
			}
		}
	}
	villaged := func(args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", n1.Name(), filepath.Join(testenv.Bins(t), "villaged")}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	pods := map[*sharedNet]*Pod{}
	for _, s := range []*sharedNet{vx, gw, au, no} {
		others(s, "ADD of "+s.name, func() {
			pods[s] = n1.NewPod()
			n1.MustAdd(s.list, pods[s])
		})
		switch s.mode {
		case "auto": // host-gw for IPv4 over this one IPv4 LAN, VXLAN for IPv6
			expect[s] = []string{s.subnet(2) + " via " + nodes[1].ip + " dev lan0 proto 86", s.subnet6(2) + " via fd00:" + fmt.Sprint(s.octet) + ":0:2:: dev " + s.vtep(), `alias "village network ` + s.name + `"`, "permanent"}
		case "vxlan":
			expect[s] = []string{s.subnet(2) + " via 10." + fmt.Sprint(s.octet) + ".2.0 dev " + s.vtep(), s.subnet6(2), `alias "village network ` + s.name + `"`, "permanent"}
		case "host-gw":
			expect[s] = []string{s.subnet(2) + " via " + nodes[1].ip + " dev lan0 proto 86"}
		case "none":
			expect[s] = []string{s.subnet(1) + " dev " + s.bridge}
		}
		if d := dumpNet(t, n1.Node, s); !strings.Contains(d.flat(), expect[s][0]) {
			t.Fatalf("after ADD, network %s lacks %q:\n%s", s.name, expect[s][0], d)
		}
	}
	// The same VNI as net-vx, also vxlan: the device is net-vx's, so ADD is
	// refused and nothing changes; the runtime's DEL after it changes nothing.
	others(dup, "ADD of "+dup.name, func() {
		p := n1.NewPod()
		_, err := n1.Add(dup.list, p)
		if err == nil || !strings.Contains(err.Error(), "belongs to another network") || !strings.Contains(err.Error(), "net-vx") {
			t.Fatalf("ADD of a second network on VNI 7: %v, want the device's owner named", err)
		}
		must(t, n1.Del(dup.list, p), "DEL after the refused ADD")
	})
	for _, s := range []*sharedNet{vx, gw, au, no} {
		others(s, "CHECK of "+s.name, func() { must(t, n1.Check(s.list, pods[s]), "CHECK %s", s.name) })
		others(s, "villaged sync of "+s.name, func() {
			out, err := villaged("sync", "--conf", s.conf, "--node-name", "node1")
			must(t, err, "villaged sync %s: %s", s.name, out)
		})
		out, err := villaged("status", "--conf", s.conf, "--node-name", "node1")
		if s != no && (err != nil || !strings.Contains(out, "in sync")) {
			t.Fatalf("villaged status of %s: %v\n%s", s.name, err, out)
		}
	}
	// villaged run of the none network: its start pass is a sweep.
	others(no, "villaged run of "+no.name, func() {
		log, stop := runVillaged(t, n1.Node, no.conf, "node1", "100ms")
		// The start pass (the sweep) follows this line and precedes the loop;
		// "stopping" below is printed after the loop, so after the sweep.
		waitFor(t, 30*time.Second, "villaged reaches its start pass", func() (bool, string) {
			return strings.Contains(log.String(), "no registry"), log.String()
		})
		stop()
		if !strings.Contains(log.String(), "no registry") || !strings.Contains(log.String(), "stopping") {
			t.Fatalf("villaged run did not complete its start pass:\n%s", log.String())
		}
	})
	for _, s := range []*sharedNet{gw, vx, au, no} {
		others(s, "DEL of "+s.name, func() { must(t, n1.Del(s.list, pods[s]), "DEL %s", s.name) })
	}
}
