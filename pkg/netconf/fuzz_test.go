package netconf_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
)

// validIfName mirrors the kernel's dev_valid_name: 1-15 bytes, not "." or
// "..", no '/', ':', NUL or (C locale) whitespace.
func validIfName(name string) bool {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch b := name[i]; {
		case b == '/' || b == ':' || b == 0:
			return false
		case b == ' ' || (b >= '\t' && b <= '\r') || b == 0xa0: // kernel isspace()
			return false
		}
	}
	return true
}

func FuzzParse(f *testing.F) {
	for _, s := range []struct{ stdin, args string }{
		{`{"cniVersion":"1.1.0","name":"net1","type":"village"}`, ""},
		{`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"village","bridge":"cni0","isGateway":true,"isDefaultGateway":true,"ipMasq":true,"mtu":1450,"hairpinMode":true,"clusterCIDR":"10.244.0.0/16","ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.244.1.0/24"}]]}}`, "IgnoreUnknown=1;K8S_POD_NAME=web-0"},
		{`{"cniVersion":"0.4.0","name":"n","type":"village","promiscMode":true,"vlan":42,"runtimeConfig":{"mac":"0a:58:0a:f4:01:05"},"args":{"cni":{"mac":"0a:58:0a:f4:01:06"}}}`, "MAC=0a:58:0a:f4:01:07"},
		{`{"cniVersion":"1.1.0","name":"n","type":"village","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":0}]}}`, ""},
		{`{"cniVersion":"0.2.0","name":"n","type":"village","prevResult":{"ip4":{"ip":"10.0.0.2/24"}}}`, ""},
		{`{"name":"n","bridge":"a/b"}`, ""},
		{`{"name":"n","mtu":-1,"vlan":5000}`, ""},
		{`{"name":"n","clusterCIDR":"10.244.1.0/16"}`, ""},
		{`{"name":"n","ipam":{"type":"../x"},"logFile":"rel"}`, ""},
		{`{"name":"n","hairpinMode":true,"promiscMode":true}`, ""},
		{`{"name":"n"}`, "FOO=bar"},
		{`{"name":"n"}`, "MAC=01:00:5e:00:00:01"},
		{`{`, ""},
		{`null`, ""},
	} {
		f.Add([]byte(s.stdin), s.args)
	}
	f.Fuzz(func(t *testing.T, stdin []byte, args string) {
		c, err := netconf.Parse(stdin, args)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("error %v is a %T, not a *types.Error", err, err)
			}
			if te.Code == 0 {
				t.Fatalf("error %v has code 0", te)
			}
			if c != nil {
				t.Fatalf("Parse returned both a config and an error %v", err)
			}
			return
		}
		if c == nil {
			t.Fatal("Parse returned neither a config nor an error")
		}
		if !validIfName(c.Bridge) {
			t.Fatalf("accepted bridge name %q, which is not a valid interface name", c.Bridge)
		}
		if c.MTU < 0 || c.MTU > 65535 {
			t.Fatalf("accepted MTU %d", c.MTU)
		}
		if c.Vlan < 0 || c.Vlan > 4094 {
			t.Fatalf("accepted vlan %d", c.Vlan)
		}
		if c.Hairpin && c.PromiscMode {
			t.Fatal("accepted hairpin together with promiscMode")
		}
		if c.MAC != nil && (len(c.MAC) != 6 || c.MAC[0]&1 != 0) {
			t.Fatalf("accepted MAC %v", c.MAC)
		}
		if c.HasIPAM && (strings.ContainsAny(c.IPAMType, "/\x00") || c.IPAMType == ".." || c.IPAMType == ".") {
			t.Fatalf("accepted ipam.type %q", c.IPAMType)
		}
		if c.LogFile != "" && !strings.HasPrefix(c.LogFile, "/") {
			t.Fatalf("accepted relative logFile %q", c.LogFile)
		}
		if c.ClusterCIDR != "" && c.ClusterNet == nil {
			t.Fatalf("clusterCIDR %q accepted but not parsed", c.ClusterCIDR)
		}
	})
}
