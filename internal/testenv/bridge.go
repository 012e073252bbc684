package testenv

import (
	"encoding/json"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// BridgeNfCalls reads bridge name's nf_call_iptables and nf_call_ip6tables
// options in n as `ip -d -j link show` reports them.
func BridgeNfCalls(t testing.TB, n ns.NetNS, name string) (v4, v6 int) {
	t.Helper()
	out := MustIP(t, n, "-d", "-j", "link", "show", "dev", name)
	var ls []struct {
		LinkInfo struct {
			Data struct {
				V4 int `json:"nf_call_iptables"`
				V6 int `json:"nf_call_ip6tables"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	if err := json.Unmarshal([]byte(out), &ls); err != nil || len(ls) != 1 {
		t.Fatalf("parsing `ip -d -j link show dev %s`: %v: %s", name, err, out)
	}
	return ls[0].LinkInfo.Data.V4, ls[0].LinkInfo.Data.V6
}
