package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// TestStaticAutoOnLink: auto through the built plugin with every static
// peer on the LAN and IPv4 pods only: no VXLAN device, host-gw routes, and
// pods with the underlay's MTU, which a full-size don't-fragment ping
// crosses.
func TestStaticAutoOnLink(t *testing.T) {
	nodes := staticCluster(t)[:2]
	var entries []string
	for _, p := range nodes {
		entries = append(entries, fmt.Sprintf(`{"name":"node-%s","ip":%q,"podCIDR":%q}`, p.ip, p.ip, p.subnet))
	}
	var addrs []string
	var pods []*Pod
	for _, n := range nodes {
		l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ovl","plugins":[{"type":"village","bridge":"village0","isDefaultGateway":true,
			"clusterCIDR":"10.60.0.0/16","ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]]},
			"backend":{"type":"auto","underlay":"lan0","vni":7,"nodes":[%s]}}]}`, filepath.Join(n.Dir, "ipam"), n.subnet, strings.Join(entries, ",")))
		p := n.NewPod()
		r := n.MustAdd(l, p)
		pods, addrs = append(pods, p), append(addrs, r.IPs[0].Address.IP.String())
		if link := testenv.MustIP(t, p.NS, "link", "show", "eth0"); !strings.Contains(link, "mtu 1500") {
			t.Errorf("auto on one LAN: pod eth0 should have mtu 1500: %s", link)
		}
		if out, err := testenv.IP(n.NS, "link", "show", "dev", "village.7"); err == nil {
			t.Errorf("auto on one LAN made village.7: %s", out)
		}
		if r := testenv.MustIP(t, n.NS, "route", "show", "proto", "86"); !strings.Contains(r, "via 192.168.78.1") || strings.Contains(r, "village.7") {
			t.Errorf("auto on one LAN: want a host-gw route: %s", r)
		}
	}
	out := inNS(t, pods[0].NS, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", "1472", addrs[1])
	if !strings.Contains(out, "1 received") {
		t.Fatalf("full-size DF ping at MTU 1500: %s", out)
	}
}
