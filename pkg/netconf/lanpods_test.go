package netconf_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
)

const lanPool = `"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.250","gateway":"192.168.50.1"}],[{"subnet":"fd50::/64","rangeStart":"fd50::10","rangeEnd":"fd50::20"}]]}`

func TestLANPods(t *testing.T) {
	for _, tc := range []struct {
		pods, want, err string
	}{
		{"", netconf.PodsAll, ""},
		{`"all"`, netconf.PodsAll, ""},
		{`"annotated"`, netconf.PodsAnnotated, ""},
		{`"Annotated"`, "", `"pods" "Annotated"`},
		{`"some"`, "", `one of "all"`},
		{`true`, "", "pods"},
	} {
		raw := `{` + lanPool
		if tc.pods != "" {
			raw += `,"pods":` + tc.pods
		}
		raw += `}`
		c, err := netconf.ParseLAN(json.RawMessage(raw))
		if tc.err != "" {
			var te *types.Error
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig {
				t.Errorf("pods %s: %v, want a config error containing %q", tc.pods, err, tc.err)
			}
			continue
		}
		if err != nil || c.Pods != tc.want {
			t.Errorf("pods %s: %+v %v, want %q", tc.pods, c, err, tc.want)
		}
	}
}

func TestParseLANAddrs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{"192.168.50.210", []string{"192.168.50.210"}, ""},
		{"192.168.50.210, fd50::15", []string{"192.168.50.210", "fd50::15"}, ""},
		{"::ffff:192.168.50.210", []string{"192.168.50.210"}, ""},
		{"192.168.50.210,192.168.50.211", nil, "same family"},
		{"fd50::1,fd50::2", nil, "same family"},
		{"a,b,c", nil, "at most 2"},
		{"", nil, "not an IP"},
		{"192.168.50.0/24", nil, "not an IP"},
		{"fe80::1%eth0", nil, "zone"},
		{"0.0.0.0", nil, "cannot be"},
		{"127.0.0.1", nil, "cannot be"},
		{"224.0.0.251", nil, "cannot be"},
	} {
		got, err := netconf.ParseLANAddrs(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v %v, want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		var s []string
		for _, a := range got {
			s = append(s, a.String())
		}
		if err != nil || !slices.Equal(s, tc.want) {
			t.Errorf("%q: %v %v, want %v", tc.in, s, err, tc.want)
		}
	}
}

func TestLANCheckAddrs(t *testing.T) {
	c, err := netconf.ParseLAN(json.RawMessage(`{` + lanPool + `}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ip string
		ok bool
	}{
		{"192.168.50.200", true}, {"192.168.50.250", true}, {"fd50::10", true},
		{"192.168.50.199", false}, {"192.168.50.251", false}, {"192.168.50.1", false},
		{"fd50::21", false}, {"10.0.0.1", false},
	} {
		err := c.CheckAddrs([]netip.Addr{netip.MustParseAddr(tc.ip)})
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.ip, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "192.168.50.200-192.168.50.250") {
			t.Errorf("%s: %v does not name the pool", tc.ip, err)
		}
	}
	// A block of another plugin, without ranges: its plugin decides.
	other, err := netconf.ParseLAN(json.RawMessage(`{"ipam":{"type":"dhcp"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.CheckAddrs([]netip.Addr{netip.MustParseAddr("10.0.0.1")}); err != nil {
		t.Errorf("a block without ranges: %v", err)
	}
}

func TestLANCNIArgs(t *testing.T) {
	conf := `{"cniVersion":"1.0.0","name":"n","type":"village","ipam":{"type":"village-ipam","subnet":"10.1.0.0/24"},"macvlan":{"pods":"annotated",` + lanPool + `}}`
	for _, tc := range []struct {
		args string
		want netconf.LANRequest
		set  bool
		err  string
	}{
		{"", netconf.LANRequest{}, false, ""},
		{"VILLAGE_LAN=true", netconf.LANRequest{Want: true}, true, ""},
		{"VILLAGE_LAN=false", netconf.LANRequest{}, true, ""},
		{"VILLAGE_LAN_IP=192.168.50.210", netconf.LANRequest{Want: true, IPs: []netip.Addr{netip.MustParseAddr("192.168.50.210")}}, true, ""},
		{"VILLAGE_LAN=1;VILLAGE_LAN_IP=192.168.50.210", netconf.LANRequest{Want: true, IPs: []netip.Addr{netip.MustParseAddr("192.168.50.210")}}, true, ""},
		{"VILLAGE_LAN=false;VILLAGE_LAN_IP=192.168.50.210", netconf.LANRequest{}, false, "VILLAGE_LAN=false"},
		{"VILLAGE_LAN=yes", netconf.LANRequest{}, false, "VILLAGE_LAN"},
		{"VILLAGE_LAN_IP=x", netconf.LANRequest{}, false, "VILLAGE_LAN_IP"},
	} {
		c, err := netconf.Parse([]byte(conf), tc.args)
		if tc.err != "" {
			var te *types.Error
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &te) || te.Code != types.ErrInvalidEnvironmentVariables {
				t.Errorf("%q: %v, want code 4 containing %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || c.LANArgsSet != tc.set || c.LANArgs.Want != tc.want.Want || !slices.Equal(c.LANArgs.IPs, tc.want.IPs) {
			t.Errorf("%q: %+v set=%v %v, want %+v set=%v", tc.args, c.LANArgs, c.LANArgsSet, err, tc.want, tc.set)
		}
	}
}

func TestPodRefCheck(t *testing.T) {
	for _, tc := range []struct {
		p  netconf.PodRef
		ok bool
	}{
		{netconf.PodRef{Namespace: "default", Name: "web-0"}, true},
		{netconf.PodRef{Namespace: "default", Name: "web.example-0"}, true},
		{netconf.PodRef{Namespace: "Default", Name: "web-0"}, false},
		{netconf.PodRef{Namespace: "default", Name: "web_0"}, false},
		{netconf.PodRef{Namespace: "default", Name: ""}, false},
		{netconf.PodRef{Namespace: "", Name: "x"}, false},
	} {
		if err := tc.p.Check(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
}

// FuzzParseLANAddrs: whatever the annotation holds, what is accepted is at
// most one address per family, none unusable, and prints back parseable.
func FuzzParseLANAddrs(f *testing.F) {
	for _, s := range []string{"192.168.50.210", "192.168.50.210,fd50::1", "::ffff:1.2.3.4", "fe80::1%eth0", ",", "1.1.1.1,,", "224.0.0.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ips, err := netconf.ParseLANAddrs(s)
		if err != nil {
			return
		}
		if len(ips) == 0 || len(ips) > netconf.MaxLANAddrs {
			t.Fatalf("%q: %d addresses", s, len(ips))
		}
		if len(ips) == 2 && ips[0].Is4() == ips[1].Is4() {
			t.Fatalf("%q: two of one family: %v", s, ips)
		}
		for _, a := range ips {
			if a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() {
				t.Fatalf("%q: accepted %v", s, a)
			}
			if b, err := netconf.ParseLANAddrs(a.String()); err != nil || b[0] != a {
				t.Fatalf("%q: %v does not parse back: %v %v", s, a, b, err)
			}
		}
	})
}
