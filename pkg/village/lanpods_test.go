package village

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/netconf"
)

func TestIPAMArgsDropVillageKeys(t *testing.T) {
	for in, want := range map[string]string{
		"":                               "",
		"IgnoreUnknown=1;K8S_POD_NAME=a": "IgnoreUnknown=1;K8S_POD_NAME=a",
		"VILLAGE_LAN=true":               "",
		"IP=10.0.0.5;VILLAGE_LAN_IP=192.168.50.9":                         "IP=10.0.0.5",
		"VILLAGE_LAN=1;MAC=02:00:00:00:00:09;VILLAGE_LAN_IP=192.168.50.9": "MAC=02:00:00:00:00:09",
	} {
		if got := ipamArgs(in); got != want {
			t.Errorf("ipamArgs(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWithRequestedIPs(t *testing.T) {
	in := []byte(`{"name":"n","args":{"cni":{"ips":["10.0.0.5"],"other":1},"x":2},"ipam":{}}`)
	out, err := withRequestedIPs(in, []netip.Addr{netip.MustParseAddr("192.168.50.210"), netip.MustParseAddr("fd50::5")})
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Args struct {
			CNI struct {
				IPs   []string `json:"ips"`
				Other int      `json:"other"`
			} `json:"cni"`
			X int `json:"x"`
		} `json:"args"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Args.CNI.IPs) != 2 || m.Args.CNI.IPs[0] != "192.168.50.210" || m.Args.CNI.IPs[1] != "fd50::5" || m.Args.CNI.Other != 1 || m.Args.X != 2 {
		t.Fatalf("%s", out)
	}
	if same, _ := withRequestedIPs(in, nil); string(same) != string(in) {
		t.Fatalf("no request changed stdin: %s", same)
	}
}

func TestLANAttached(t *testing.T) {
	const base = `{"cniVersion":"1.0.0","name":"n","type":"village","ipam":{"type":"village-ipam","subnet":"10.1.0.0/24"},` +
		`"macvlan":{"pods":%q,"ipam":{"type":"village-ipam","subnet":"192.168.50.0/24"}}%s}`
	prevLAN := `,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"},{"name":"net1","sandbox":"/x"}],"ips":[]}`
	prevNone := `,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[]}`
	for _, tc := range []struct {
		pods, prev string
		want       bool
	}{
		{"all", prevNone, true}, {"annotated", "", true}, {"annotated", prevLAN, true}, {"annotated", prevNone, false},
	} {
		conf, err := netconf.Parse([]byte(fmt.Sprintf(base, tc.pods, tc.prev)), "")
		if err != nil {
			t.Fatal(err)
		}
		if got := lanAttached(conf); got != tc.want {
			t.Errorf("pods %s prev %q: %v, want %v", tc.pods, tc.prev, got, tc.want)
		}
	}
}

// The LAN failure reason comes from village-ipam's code and details, not
// from its message's wording.
func TestLANFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{types.NewError(ipamExhausted, "no free address", ""), agentsock.FailExhausted},
		{types.NewError(ipamAddressUnavailable, "requested address 10.0.0.9 is already allocated", ""), agentsock.FailTaken},
		{types.NewError(ipamAddressUnavailable, "outside? the message does not matter", ""), agentsock.FailTaken},
		{types.NewError(ipamAddressUnavailable, "requested address 10.9.0.1 is not in the pool", ipamDetailOutsidePool), agentsock.FailOutsidePool},
		{fmt.Errorf("wrapped: %w", types.NewError(ipamAddressUnavailable, "x", ipamDetailOutsidePool)), agentsock.FailOutsidePool},
		{types.NewError(types.ErrIOFailure, "disk", ""), agentsock.FailOther},
		{fmt.Errorf("not a CNI error"), agentsock.FailOther},
	} {
		if got := lanFailure(tc.err); got != tc.want {
			t.Errorf("lanFailure(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
