package netconf_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/validate"
)

// conf builds a minimal valid `village` config with extra top-level keys
// spliced in (extra is JSON object members without braces, may be empty).
func conf(extra string) []byte {
	s := `{"cniVersion":"1.1.0","name":"net1","type":"village"`
	if extra != "" {
		s += "," + extra
	}
	return []byte(s + "}")
}

func mustParse(t *testing.T, stdin []byte, args string) *netconf.NetConf {
	t.Helper()
	c, err := netconf.Parse(stdin, args)
	if err != nil {
		t.Fatalf("Parse(%s, %q): unexpected error %v", stdin, args, err)
	}
	return c
}

// wantErr checks that Parse fails with a *types.Error of the given code whose
// message contains every one of want.
func wantErr(t *testing.T, stdin []byte, args string, code uint, want ...string) {
	t.Helper()
	c, err := netconf.Parse(stdin, args)
	if err == nil {
		t.Fatalf("Parse(%.200s, %q) = %+v, want error code %d", stdin, args, c, code)
	}
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("Parse error %v (%T) is not a *types.Error", err, err)
	}
	if te.Code != code {
		t.Errorf("Parse error code = %d (%v), want %d", te.Code, te, code)
	}
	msg := te.Msg + " " + te.Details
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("Parse error %q does not mention %q", msg, w)
		}
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, conf(""), "")
	if c.Bridge != "village0" || netconf.DefaultBridge != "village0" {
		t.Errorf("Bridge = %q, want village0", c.Bridge)
	}
	if !c.Hairpin {
		t.Error("Hairpin off by default, want on")
	}
	if c.IsGateway || c.IsDefaultGW || c.ForceAddress || c.IPMasq || c.PromiscMode {
		t.Errorf("boolean keys not false by default: %+v", c)
	}
	if c.MTU != 0 || c.Vlan != 0 {
		t.Errorf("MTU/Vlan = %d/%d, want 0/0", c.MTU, c.Vlan)
	}
	if c.MAC != nil || c.ClusterNet != nil || c.HasIPAM || c.IPAMType != "" {
		t.Errorf("derived fields set without config: MAC=%v ClusterNet=%v HasIPAM=%v IPAMType=%q", c.MAC, c.ClusterNet, c.HasIPAM, c.IPAMType)
	}
	if c.Name != "net1" || c.Type != "village" || c.CNIVersion != "1.1.0" {
		t.Errorf("name/type/version = %q/%q/%q", c.Name, c.Type, c.CNIVersion)
	}
}

func TestMissingCNIVersionIs010(t *testing.T) {
	c := mustParse(t, []byte(`{"name":"n","type":"village"}`), "")
	if c.CNIVersion != "0.1.0" {
		t.Errorf("CNIVersion = %q, want 0.1.0", c.CNIVersion)
	}
}

func TestHairpinPromisc(t *testing.T) {
	for _, tc := range []struct {
		extra   string
		hairpin bool
		promisc bool
	}{
		{``, true, false},
		{`"hairpinMode":true`, true, false},
		{`"hairpinMode":false`, false, false},
		{`"promiscMode":true`, false, true},
		{`"promiscMode":true,"hairpinMode":false`, false, true},
		{`"promiscMode":false,"hairpinMode":true`, true, false},
	} {
		c := mustParse(t, conf(tc.extra), "")
		if c.Hairpin != tc.hairpin || c.PromiscMode != tc.promisc {
			t.Errorf("%s: Hairpin=%v PromiscMode=%v, want %v %v", tc.extra, c.Hairpin, c.PromiscMode, tc.hairpin, tc.promisc)
		}
	}
	wantErr(t, conf(`"hairpinMode":true,"promiscMode":true`), "", types.ErrInvalidNetworkConfig, "hairpinMode", "promiscMode")
}

func TestReferenceBridgeKeys(t *testing.T) {
	c := mustParse(t, conf(`"bridge":"cni0","isGateway":true,"isDefaultGateway":true,"forceAddress":true,
		"ipMasq":true,"mtu":1400,"hairpinMode":false,"promiscMode":true,"vlan":100,
		"runtimeConfig":{"mac":"0a:58:0a:f4:01:05"},
		"ipam":{"type":"host-local","subnet":"10.244.1.0/24"}`), "")
	if c.Bridge != "cni0" {
		t.Errorf("Bridge = %q", c.Bridge)
	}
	if !c.IsGateway || !c.IsDefaultGW || !c.ForceAddress || !c.IPMasq || !c.PromiscMode || c.Hairpin {
		t.Errorf("booleans: isGateway=%v isDefaultGateway=%v forceAddress=%v ipMasq=%v promisc=%v hairpin=%v",
			c.IsGateway, c.IsDefaultGW, c.ForceAddress, c.IPMasq, c.PromiscMode, c.Hairpin)
	}
	if c.MTU != 1400 || c.Vlan != 100 {
		t.Errorf("MTU=%d Vlan=%d", c.MTU, c.Vlan)
	}
	if c.MAC.String() != "0a:58:0a:f4:01:05" {
		t.Errorf("MAC = %v", c.MAC)
	}
	if !c.HasIPAM || c.IPAMType != "host-local" || c.IPAM.Type != "host-local" {
		t.Errorf("IPAM: HasIPAM=%v IPAMType=%q", c.HasIPAM, c.IPAMType)
	}
}

func TestMTUAndVlanBounds(t *testing.T) {
	for _, ok := range []string{`"mtu":0`, `"mtu":68`, `"mtu":9000`, `"mtu":65535`, `"vlan":0`, `"vlan":1`, `"vlan":4094`} {
		mustParse(t, conf(ok), "")
	}
	for _, tc := range []struct{ extra, want string }{
		{`"mtu":-1`, `"mtu": MTU -1`},
		{`"mtu":67`, `"mtu": MTU 67`},
		{`"mtu":65536`, `"mtu": MTU 65536`},
		{`"vlan":-1`, `"vlan" -1`},
		{`"vlan":4095`, `"vlan" 4095`},
		{`"vlan":5000`, `"vlan" 5000`},
	} {
		wantErr(t, conf(tc.extra), "", types.ErrInvalidNetworkConfig, tc.want)
	}
}

func TestBridgeName(t *testing.T) {
	for _, ok := range []string{"br0", "cni0", "a", "abcdefghijklmno" /* 15 */, "my-br.1_x"} {
		c := mustParse(t, conf(`"bridge":"`+ok+`"`), "")
		if c.Bridge != ok {
			t.Errorf("Bridge = %q, want %q", c.Bridge, ok)
		}
	}
	for _, bad := range []string{"a/b", "abcdefghijklmnop" /* 16 */, "a-very-long-bridge-name", ".", "..", "a:b", "a b", `a\tb`,
		// The kernel cuts a name at NUL: "village0\0x" would silently mean
		// the bridge "village0", shared with another network.
		`village0\u0000x`, `\u0000`} {
		wantErr(t, conf(`"bridge":"`+bad+`"`), "", types.ErrInvalidNetworkConfig, `"bridge"`)
	}
}

func TestMACSources(t *testing.T) {
	const (
		rc   = "0a:00:00:00:00:01"
		args = "0a:00:00:00:00:02"
		env  = "0a:00:00:00:00:03"
	)
	rcKey := `"runtimeConfig":{"mac":"` + rc + `"}`
	argsKey := `"args":{"cni":{"mac":"` + args + `"}}`
	envArgs := "MAC=" + env
	for _, tc := range []struct {
		name, extra, env, want string
	}{
		{"none", ``, ``, ``},
		{"runtimeConfig", rcKey, ``, rc},
		{"args", argsKey, ``, args},
		{"CNI_ARGS", ``, envArgs, env},
		{"runtimeConfig over args", rcKey + "," + argsKey, ``, rc},
		{"runtimeConfig over CNI_ARGS", rcKey, envArgs, rc},
		{"args over CNI_ARGS", argsKey, envArgs, args},
		{"all three", rcKey + "," + argsKey, envArgs, rc},
		{"args without mac falls to CNI_ARGS", `"args":{"cni":{"ips":["10.0.0.5"]}}`, envArgs, env},
		{"bad CNI_ARGS MAC shadowed by runtimeConfig", rcKey, "MAC=garbage", rc},
		{"bad args MAC shadowed by runtimeConfig", rcKey + `,"args":{"cni":{"mac":"garbage"}}`, ``, rc},
		{"upper-case MAC", `"runtimeConfig":{"mac":"0A:58:0A:F4:01:05"}`, ``, "0a:58:0a:f4:01:05"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, conf(tc.extra), tc.env)
			got := ""
			if c.MAC != nil {
				got = c.MAC.String()
			}
			if got != tc.want {
				t.Errorf("MAC = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBadMAC(t *testing.T) {
	for _, tc := range []struct {
		name, extra, env string
		want             []string
	}{
		{"runtimeConfig garbage", `"runtimeConfig":{"mac":"not-a-mac"}`, "", []string{"runtimeConfig.mac", "not-a-mac"}},
		{"args garbage", `"args":{"cni":{"mac":"0a:58:0a"}}`, "", []string{"args.cni.mac", "0a:58:0a"}},
		{"CNI_ARGS garbage", ``, "MAC=zz:zz:zz:zz:zz:zz", []string{"CNI_ARGS MAC", "zz:zz"}},
		{"8-byte EUI-64", `"runtimeConfig":{"mac":"02:00:5e:10:00:00:00:01"}`, "", []string{"runtimeConfig.mac"}},
		{"multicast runtimeConfig", `"runtimeConfig":{"mac":"01:00:5e:00:00:01"}`, "", []string{"runtimeConfig.mac", "multicast"}},
		{"broadcast args", `"args":{"cni":{"mac":"ff:ff:ff:ff:ff:ff"}}`, "", []string{"args.cni.mac", "multicast"}},
		{"multicast CNI_ARGS", ``, "MAC=03:00:00:00:00:00", []string{"CNI_ARGS MAC", "multicast"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, conf(tc.extra), tc.env, types.ErrInvalidNetworkConfig, tc.want...)
		})
	}
}

func TestClusterCIDR(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.244.0.0/16", "10.244.0.0/16"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"fd00:10:244::/56", "fd00:10:244::/56"},
		{"10.1.2.3/32", "10.1.2.3/32"},
	} {
		c := mustParse(t, conf(`"clusterCIDR":"`+tc.in+`"`), "")
		if c.ClusterNet == nil || c.ClusterNet.String() != tc.want {
			t.Errorf("clusterCIDR %q: ClusterNet = %v, want %s", tc.in, c.ClusterNet, tc.want)
		}
		if c.ClusterCIDR != tc.in {
			t.Errorf("ClusterCIDR = %q, want %q kept as written", c.ClusterCIDR, tc.in)
		}
	}
	wantErr(t, conf(`"clusterCIDR":"10.244.1.0/16"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", "10.244.1.0/16", "host bits", "10.244.0.0/16")
	wantErr(t, conf(`"clusterCIDR":"fd00::1/64"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", "host bits", "fd00::/64")
	for _, bad := range []string{"10.244.0.0", "10.244.0.0/33", "banana", "/16"} {
		wantErr(t, conf(`"clusterCIDR":"`+bad+`"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", bad)
	}
}

func TestIPAMType(t *testing.T) {
	for _, ok := range []string{"host-local", "village-ipam", "static", "whereabouts"} {
		c := mustParse(t, conf(`"ipam":{"type":"`+ok+`"}`), "")
		if c.IPAMType != ok || !c.HasIPAM {
			t.Errorf("IPAMType = %q (HasIPAM %v), want %q", c.IPAMType, c.HasIPAM, ok)
		}
	}
	for _, bad := range []string{"../host-local", "..", ".", "/usr/bin/evil", "sub/dir", `a\\b`} {
		wantErr(t, conf(`"ipam":{"type":"`+bad+`"}`), "", types.ErrInvalidNetworkConfig, "ipam.type")
	}
	if err := netconf.ValidatePluginType(strings.Repeat("x", 256)); err == nil {
		t.Error("ValidatePluginType accepted a 256-byte name")
	}
	if err := netconf.ValidatePluginType("a\x00b"); err == nil {
		t.Error("ValidatePluginType accepted a NUL byte")
	}
}

func TestLogSettings(t *testing.T) {
	mustParse(t, conf(`"logFile":"/var/log/village.log","logLevel":"DEBUG"`), "")
	for _, lvl := range []string{"debug", "info", "warn", "warning", "WARNING", "error", ""} {
		mustParse(t, conf(`"logLevel":"`+lvl+`"`), "")
	}
	// One accepted set: the config parser takes exactly the levels the log
	// (pkg/cnilog, which reads the same key at every verb) takes.
	for _, lvl := range []string{"debug", "info", "warn", "warning", "error", "", "trace", "fatal", "Warn", "err"} {
		_, logErr := validate.LogLevel(lvl)
		_, confErr := netconf.Parse(conf(`"logLevel":"`+lvl+`"`), "")
		if (logErr == nil) != (confErr == nil) {
			t.Errorf("logLevel %q: cnilog says %v, netconf says %v", lvl, logErr, confErr)
		}
	}
	wantErr(t, conf(`"logFile":"village.log"`), "", types.ErrInvalidNetworkConfig, "logFile", "village.log", "absolute")
	wantErr(t, conf(`"logFile":"../x.log"`), "", types.ErrInvalidNetworkConfig, "logFile")
	wantErr(t, conf(`"logLevel":"trace"`), "", types.ErrInvalidNetworkConfig, "logLevel", "trace")
}

// TestNames pins the shared rules (pkg/validate) as this parser applies
// them: a CNI network name of at most 200 bytes (the IPAM block's and the
// stores' bound), and link names as the kernel takes them, NUL and control
// bytes refused.
func TestNames(t *testing.T) {
	long := strings.Repeat("n", 200)
	mustParse(t, []byte(`{"cniVersion":"1.1.0","name":"`+long+`","type":"village"}`), "")
	wantErr(t, []byte(`{"cniVersion":"1.1.0","name":"`+long+`x","type":"village"}`), "", types.ErrInvalidNetworkConfig, "name", "200")
	wantErr(t, []byte(`{"cniVersion":"1.1.0","name":"-net","type":"village"}`), "", types.ErrInvalidNetworkConfig, "name")
	for _, bad := range []string{`village\u0000x`, `vil\u0001lage`, `a:b`, `a/b`, `a b`, `..`, `0123456789abcdef`} {
		wantErr(t, conf(`"bridge":"`+bad+`"`), "", types.ErrInvalidNetworkConfig, "bridge")
		wantErr(t, conf(`"backend":{"underlay":"`+bad+`"}`), "", types.ErrInvalidNetworkConfig, "underlay")
	}
	mustParse(t, conf(`"bridge":"0123456789abcde"`), "")
}

func TestDecodeErrors(t *testing.T) {
	for _, in := range []string{``, `{`, `not json`, `[]`, `{"name":1}`, `{"name":"n","mtu":"1500"}`, `{"name":"n","hairpinMode":"yes"}`} {
		wantErr(t, []byte(in), "", types.ErrDecodingFailure, "failed to parse network config")
	}
	wantErr(t, conf(`"prevResult":{"cniVersion":"1.1.0","ips":"nope"}`), "", types.ErrDecodingFailure, "prevResult")
}

func TestNetworkName(t *testing.T) {
	wantErr(t, []byte(`{"cniVersion":"1.1.0","type":"village"}`), "", types.ErrInvalidNetworkConfig, "name")
	wantErr(t, []byte(`{"cniVersion":"1.1.0","name":"bad/name","type":"village"}`), "", types.ErrInvalidNetworkConfig)
	wantErr(t, []byte(`{"cniVersion":"1.1.0","name":"a b","type":"village"}`), "", types.ErrInvalidNetworkConfig)
}

func TestPrevResult(t *testing.T) {
	c := mustParse(t, conf(`"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":0}]}`), "")
	if c.PrevResult == nil {
		t.Fatal("PrevResult not parsed")
	}
}

func TestHugeConfig(t *testing.T) {
	pad := `"x":"` + strings.Repeat("a", netconf.MaxConfigSize) + `"`
	wantErr(t, conf(pad), "", types.ErrInvalidNetworkConfig, "bytes", "1048576")
	// Just under the limit is fine (unknown keys are ignored).
	base := conf(`"x":""`)
	fill := netconf.MaxConfigSize - len(base)
	ok := bytes.Replace(base, []byte(`"x":""`), []byte(`"x":"`+strings.Repeat("a", fill)+`"`), 1)
	if len(ok) != netconf.MaxConfigSize {
		t.Fatalf("built a %d-byte config, want %d", len(ok), netconf.MaxConfigSize)
	}
	mustParse(t, ok, "")
}

func TestCNIArgs(t *testing.T) {
	for _, ok := range []string{
		"",
		"IP=10.244.1.5",
		"K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=default;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234",
		"IgnoreUnknown=1;FOO=bar",
		"IgnoreUnknown=true;FOO=bar;IP=10.0.0.1",
		"FOO=bar;IgnoreUnknown=1", // order does not matter
		"MAC=0a:00:00:00:00:09;IP=10.244.1.5",
	} {
		mustParse(t, conf(""), ok)
	}
	for _, tc := range []struct{ args, want string }{
		{"FOO=bar", "FOO=bar"},
		{"K8S_POD_NAME=x;BOGUS=1", "BOGUS"},
		{"IgnoreUnknown=0;FOO=bar", "FOO"},
		{"novalue", "novalue"},
		{"A=b=c", "A=b=c"},
		{"IgnoreUnknown=maybe", "IgnoreUnknown"},
	} {
		wantErr(t, conf(""), tc.args, types.ErrInvalidEnvironmentVariables, "CNI_ARGS", tc.want)
	}
}

// The derived MAC must be usable as-is by netlink: exactly 6 bytes, unicast.
func TestMACIsUnicast6Bytes(t *testing.T) {
	c := mustParse(t, conf(`"runtimeConfig":{"mac":"02-00-00-aa-bb-cc"}`), "")
	if len(c.MAC) != 6 || c.MAC[0]&1 != 0 {
		t.Errorf("MAC = %v", c.MAC)
	}
	if !bytes.Equal(c.MAC, net.HardwareAddr{2, 0, 0, 0xaa, 0xbb, 0xcc}) {
		t.Errorf("MAC = %v", c.MAC)
	}
}

// TestEveryReferenceKeyHasItsMeaning walks the keys of the reference bridge
// plugin's NetConf (containernetworking/plugins v1.10.0 plugins/main/bridge)
// that take a non-default value: each is either implemented (parsed into
// the field that carries it) or rejected with an error naming the key.
func TestEveryReferenceKeyHasItsMeaning(t *testing.T) {
	implemented := []struct {
		member string
		ok     func(*netconf.NetConf) bool
	}{
		{`"ipMasqBackend":"nftables"`, func(c *netconf.NetConf) bool { return c.IPMasqBackend == "nftables" }},
		{`"ipMasqBackend":"iptables"`, func(c *netconf.NetConf) bool { return c.IPMasqBackend == "iptables" }},
		{`"macspoofchk":true`, func(c *netconf.NetConf) bool { return c.MacSpoofChk }},
		{`"portIsolation":true`, func(c *netconf.NetConf) bool { return c.PortIsolation }},
		{`"preserveDefaultVlan":true`, func(c *netconf.NetConf) bool { return c.PreserveDefaultVlan }},
		{`"vlanTrunk":[]`, func(c *netconf.NetConf) bool { return true }},
		{`"enabledad":false`, func(c *netconf.NetConf) bool { return true }},
		{`"disableContainerInterface":false`, func(c *netconf.NetConf) bool { return true }},
	}
	for _, k := range implemented {
		if c := mustParse(t, conf(k.member), ""); !k.ok(c) {
			t.Errorf("%s parsed but not carried: %+v", k.member, c)
		}
	}
	for _, k := range []struct{ member, key string }{
		{`"vlanTrunk":[{"id":101}]`, `"vlanTrunk"`},
		{`"vlanTrunk":[{"minID":100,"maxID":110}]`, `"vlanTrunk"`},
		{`"enabledad":true`, `"enabledad"`},
		{`"disableContainerInterface":true`, `"disableContainerInterface"`},
		{`"ipMasqBackend":"ebtables"`, `"ipMasqBackend"`},
	} {
		wantErr(t, conf(k.member), "", types.ErrInvalidNetworkConfig, k.key)
	}
}

// Dual stack: clusterCIDR names one network per family, as
// kube-controller-manager's --cluster-cidr does, and the netfilter spec
// keeps both, so neither family's pod-to-pod traffic is masqueraded.
func TestClusterCIDRDualStack(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.244.0.0/16,fd00:10:244::/56", "[10.244.0.0/16 fd00:10:244::/56]"},
		{"fd00:10:244::/56, 10.244.0.0/16", "[fd00:10:244::/56 10.244.0.0/16]"},
	} {
		c := mustParse(t, conf(`"ipMasq":true,"clusterCIDR":"`+tc.in+`"`), "")
		if fmt.Sprint(c.ClusterNets) != tc.want || c.ClusterNet.String() != c.ClusterNets[0].String() {
			t.Errorf("clusterCIDR %q: ClusterNets %v, ClusterNet %v; want %s and its first", tc.in, c.ClusterNets, c.ClusterNet, tc.want)
		}
		if s := c.Netfilter(nil); fmt.Sprint(s.Cluster) != tc.want {
			t.Errorf("clusterCIDR %q: Netfilter().Cluster = %v, want %s", tc.in, s.Cluster, tc.want)
		}
	}
	wantErr(t, conf(`"clusterCIDR":"10.244.0.0/16,10.245.0.0/16"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", "one family")
	wantErr(t, conf(`"clusterCIDR":"fd00::/56,fd01::/56"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", "one family")
	wantErr(t, conf(`"clusterCIDR":"10.244.0.0/16,fd00::/56,fd01::/56"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", "3 networks")
	wantErr(t, conf(`"clusterCIDR":"10.244.0.0/16,fd00::1/56"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR", "host bits", "fd00::/56")
	wantErr(t, conf(`"clusterCIDR":"10.244.0.0/16,"`), "", types.ErrInvalidNetworkConfig, "clusterCIDR")
}

func TestForwardAcceptDefaultsOn(t *testing.T) {
	if c := mustParse(t, conf(""), ""); !c.ForwardAccept || !c.Netfilter(nil).WantsRules() || !c.Netfilter(nil).NoMasquerade {
		t.Errorf("forwardAccept should default to true (rules without masquerade when ipMasq is off): %+v", c)
	}
	if c := mustParse(t, conf(`"forwardAccept":false`), ""); c.ForwardAccept || c.Netfilter(nil).Wants() {
		t.Errorf("forwardAccept false and ipMasq off: no netfilter rules wanted")
	}
	if s := mustParse(t, conf(`"forwardAccept":false,"macspoofchk":true`), "").Netfilter(nil); s.WantsRules() || !s.Wants() || !s.SpoofCheck {
		t.Errorf("macspoofchk alone: no rules of the network's own, its pods' rules kept: %+v", s)
	}
	c := mustParse(t, conf(`"forwardAccept":false,"ipMasq":true,"ipMasqBackend":"iptables","clusterCIDR":"10.0.0.0/8"`), "")
	s := c.Netfilter(nil)
	if s.ForwardAccept || s.NoMasquerade || s.Backend != "iptables" || len(s.Cluster) != 1 {
		t.Errorf("Netfilter() = %+v", s)
	}
}

// The plugin builds the spec from the pod's addresses, villaged from the
// node's pod subnets: in any order, with repeats or host bits, the same
// subnets give the same spec and stamp.
func TestNetfilterSpecIsCanonical(t *testing.T) {
	c := mustParse(t, conf(`"ipMasq":true,"clusterCIDR":"10.0.0.0/8"`), "")
	ipn := func(s string) *net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return &net.IPNet{IP: ip, Mask: n.Mask}
	}
	want := c.Netfilter([]*net.IPNet{ipn("10.1.2.0/24"), ipn("fd00:1::/64")})
	for _, in := range [][]*net.IPNet{
		{ipn("fd00:1::/64"), ipn("10.1.2.0/24")},
		{ipn("10.1.2.7/24"), ipn("fd00:1::5/64")},
		{ipn("fd00:1::5/64"), ipn("10.1.2.7/24"), ipn("10.1.2.9/24")},
	} {
		got := c.Netfilter(in)
		if got.Stamp() != want.Stamp() || fmt.Sprint(got.PodSubnets) != fmt.Sprint(want.PodSubnets) {
			t.Errorf("Netfilter(%v) = %v (stamp %s), want %v (stamp %s)", in, got.PodSubnets, got.Stamp(), want.PodSubnets, want.Stamp())
		}
	}
}

func TestPodMTU(t *testing.T) {
	for _, tc := range []struct {
		configured, backend, want int
	}{
		{0, 0, 0},       // no overlay: the kernel's default
		{0, 1450, 1450}, // VXLAN over a 1500 underlay
		{1400, 1450, 1400},
		{9000, 1500, 9000}, // the config wins, even above the backend's
		{1400, 0, 1400},
	} {
		c := &netconf.NetConf{MTU: tc.configured}
		if got := c.PodMTU(tc.backend); got != tc.want {
			t.Errorf("mtu %d, backend %d: PodMTU = %d, want %d", tc.configured, tc.backend, got, tc.want)
		}
	}
}

// TestNetworkPolicyKey: "networkPolicy" is parsed with the rest of the
// entry (default off), and a value that is not a boolean fails the parse
// like any other mistyped key instead of being read as off.
func TestNetworkPolicyKey(t *testing.T) {
	for _, tc := range []struct {
		extra string
		want  bool
	}{
		{"", false},
		{`"networkPolicy":false`, false},
		{`"networkPolicy":true`, true},
		{`"networkPolicy":null`, false},
	} {
		if got := mustParse(t, conf(tc.extra), "").NetworkPolicy; got != tc.want {
			t.Errorf("%s: NetworkPolicy = %v, want %v", tc.extra, got, tc.want)
		}
	}
	for _, bad := range []string{`"networkPolicy":"true"`, `"networkPolicy":1`, `"networkPolicy":{}`} {
		wantErr(t, conf(bad), "", types.ErrDecodingFailure, "networkPolicy")
	}
}
