package village

import (
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/pkg/netconf"
)

func TestWithIPAMRewritesGCList(t *testing.T) {
	in := []byte(`{"cniVersion":"1.1.0","name":"n","type":"village","ipam":{"type":"village-ipam","subnet":"10.0.0.0/24"},
		"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}`)
	out, err := withIPAM(in, json.RawMessage(`{"type":"village-ipam","subnet":"192.168.50.0/24"}`), "net1")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		IPAM  struct{ Subnet string } `json:"ipam"`
		Valid []types.GCAttachment    `json:"cni.dev/valid-attachments"`
		Old   []types.GCAttachment    `json:"cni.dev/attachments"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if m.IPAM.Subnet != "192.168.50.0/24" || len(m.Valid) != 1 || m.Valid[0].IfName != "net1" || m.Old[0].IfName != "net1" || m.Valid[0].ContainerID != "a" {
		t.Fatalf("rewritten config: %s", out)
	}
}

func TestChainShiftsIndexes(t *testing.T) {
	prev := &current.Result{CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: "lo"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)}}},
	}
	ours := &current.Result{CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: "br"}, {Name: "veth"}, {Name: "eth0", Sandbox: "/x"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(2), Address: net.IPNet{IP: net.ParseIP("10.0.0.2"), Mask: net.CIDRMask(24, 32)}}},
		DNS:        types.DNS{Nameservers: []string{"10.0.0.10"}},
	}
	got, err := chain(prev, ours)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Interfaces) != 4 || got.Interfaces[3].Name != "eth0" || *got.IPs[1].Interface != 3 || *got.IPs[0].Interface != 0 || got.DNS.Nameservers[0] != "10.0.0.10" {
		t.Fatalf("chained result %+v", got)
	}
}

func TestPodIfaceRoutesUseTheirFamilysGateway(t *testing.T) {
	_, def4, _ := net.ParseCIDR("0.0.0.0/0")
	_, def6, _ := net.ParseCIDR("::/0")
	res := &current.Result{
		IPs: []*current.IPConfig{
			{Address: net.IPNet{IP: net.ParseIP("10.0.0.2").To4(), Mask: net.CIDRMask(24, 32)}, Gateway: net.ParseIP("10.0.0.1")},
			{Address: net.IPNet{IP: net.ParseIP("fd00::2"), Mask: net.CIDRMask(64, 128)}, Gateway: net.ParseIP("fd00::1")},
		},
		Routes: []*types.Route{{Dst: *def4}, {Dst: *def6}, {Dst: *def4, GW: net.ParseIP("10.0.0.254")}},
	}
	c := podIface(nil, res, res.IPs)
	if len(c.Addrs) != 2 || len(c.Routes) != 3 {
		t.Fatalf("%+v", c)
	}
	if !c.Routes[0].GW.Equal(net.ParseIP("10.0.0.1")) || !c.Routes[1].GW.Equal(net.ParseIP("fd00::1")) || !c.Routes[2].GW.Equal(net.ParseIP("10.0.0.254")) {
		t.Fatalf("gateways %v %v %v", c.Routes[0].GW, c.Routes[1].GW, c.Routes[2].GW)
	}
	// A route of a family the interface has no address in is not installed.
	only4 := res.IPs[:1]
	if c := podIface(nil, res, only4); len(c.Routes) != 2 {
		t.Fatalf("IPv6 route kept on an IPv4-only interface: %+v", c.Routes)
	}
}

func TestCheckBrNetfilter(t *testing.T) {
	dir := t.TempDir()
	if err := checkBrNetfilter(dir); err != nil {
		t.Fatalf("with the sysctl directory present: %v", err)
	}
	missing := filepath.Join(dir, "bridge")
	err := checkBrNetfilter(missing)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable ||
		!strings.Contains(te.Msg, "br_netfilter is not loaded") || !strings.Contains(te.Msg, missing) || !strings.Contains(te.Msg, "modprobe br_netfilter") {
		t.Fatalf("with %s missing: %#v, want code 50 naming the module, the path and the fix", missing, err)
	}
}

// TestAddRefusesIfNameWithControlBytes: a CNI_IFNAME the IPAM store would
// refuse (a control byte; CNI's own check lets it through) fails the ADD
// with code 4 before the pod namespace is opened or an IPAM plugin reads
// its input.
func TestAddRefusesIfNameWithControlBytes(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.1.0","name":"net1","type":"village","ipam":{"type":"village-ipam-does-not-exist"}}`)
	err := Add(&skel.CmdArgs{ContainerID: "c1", IfName: "eth\x010", Netns: "/nonexistent", StdinData: conf})
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(te.Msg, "CNI_IFNAME") {
		t.Fatalf("Add = %v, want code %d naming CNI_IFNAME", err, types.ErrInvalidEnvironmentVariables)
	}
}

// fillGateways: isDefaultGateway gives a default route through the
// gateway per family the pod has an address of (the shipped ConfigMap
// relies on it for dual stack), keeps a default route IPAM already gave,
// and isGateway alone fills gateways but adds no route.
func TestFillGateways(t *testing.T) {
	addr := func(s string) *current.IPConfig {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return &current.IPConfig{Address: *n}
	}
	for _, tc := range []struct {
		name         string
		gw, dflt     bool
		ips          []string
		routes       []string // dst via gw, from IPAM
		wantGWs      []string
		wantDefaults []string // "dst via gw"
	}{
		{"dual stack", true, true, []string{"10.244.1.5/24", "fd00:10:244:1::5/64"}, nil,
			[]string{"10.244.1.1", "fd00:10:244:1::1"}, []string{"0.0.0.0/0 via 10.244.1.1", "::/0 via fd00:10:244:1::1"}},
		{"IPv6 only", true, true, []string{"fd00::9/64"}, nil, []string{"fd00::1"}, []string{"::/0 via fd00::1"}},
		{"IPAM's default kept", true, true, []string{"10.0.0.5/24"}, []string{"0.0.0.0/0 via 10.0.0.254"},
			[]string{"10.0.0.1"}, []string{"0.0.0.0/0 via 10.0.0.254"}},
		{"isGateway alone", true, false, []string{"10.0.0.5/24", "fd00::5/64"}, nil, []string{"10.0.0.1", "fd00::1"}, nil},
		{"neither", false, false, []string{"10.0.0.5/24"}, nil, []string{"<nil>"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &current.Result{}
			for _, s := range tc.ips {
				res.IPs = append(res.IPs, addr(s))
			}
			for _, r := range tc.routes {
				dst, via, _ := strings.Cut(r, " via ")
				_, n, _ := net.ParseCIDR(dst)
				res.Routes = append(res.Routes, &types.Route{Dst: *n, GW: net.ParseIP(via)})
			}
			a := &adder{conf: &netconf.NetConf{IsGateway: tc.gw, IsDefaultGW: tc.dflt}, result: res}
			a.fillGateways()
			var gws, defaults []string
			for _, ipc := range res.IPs {
				gws = append(gws, ipc.Gateway.String())
			}
			for _, r := range res.Routes {
				defaults = append(defaults, r.Dst.String()+" via "+r.GW.String())
			}
			if strings.Join(gws, ",") != strings.Join(tc.wantGWs, ",") || strings.Join(defaults, ",") != strings.Join(tc.wantDefaults, ",") {
				t.Fatalf("gateways %v routes %v, want %v and %v", gws, defaults, tc.wantGWs, tc.wantDefaults)
			}
		})
	}
}
