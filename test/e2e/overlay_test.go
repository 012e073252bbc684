package e2e

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/village"
)

type clusterNode struct {
	*Node
	ip, subnet, subnet6 string
}

// staticCluster makes three nodes on one namespace LAN.
func staticCluster(t *testing.T) []*clusterNode {
	lan := NewLAN(t)
	var nodes []*clusterNode
	for i := 1; i <= 3; i++ {
		n := &clusterNode{Node: NewNode(t), ip: fmt.Sprintf("192.168.78.1%d", i),
			subnet: fmt.Sprintf("10.60.%d.0/24", i), subnet6: fmt.Sprintf("fd60:0:0:%d::/64", i)}
		lan.Attach(t, n.NS, "lan0", n.ip+"/24")
		testenv.MustIP(t, n.NS, "-6", "addr", "add", fmt.Sprintf("fd78::1%d/64", i), "dev", "lan0", "nodad")
		nodes = append(nodes, n)
	}
	return nodes
}

// list is node n's conflist. host-gw routes a pod subnet via the peer's
// underlay address, so over this IPv4 LAN it carries IPv4 pods only; vxlan
// and auto carry both families.
func (n *clusterNode) list(t *testing.T, mode string, peers []*clusterNode, extra string) *libcni.NetworkConfigList {
	var entries []string
	for _, p := range peers {
		cidrs := fmt.Sprintf("%q,%q", p.subnet, p.subnet6)
		if mode == "host-gw" {
			cidrs = fmt.Sprintf("%q", p.subnet)
		}
		entries = append(entries, fmt.Sprintf(`{"name":"node-%s","ip":%q,"podCIDRs":[%s]}`, p.ip, p.ip, cidrs))
	}
	ranges := fmt.Sprintf(`[{"subnet":%q}],[{"subnet":%q}]`, n.subnet, n.subnet6)
	if mode == "host-gw" {
		ranges = fmt.Sprintf(`[{"subnet":%q}]`, n.subnet)
	}
	return ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ovl","plugins":[{"type":"village","bridge":"village0","isDefaultGateway":true,
		"ipMasq":true,"clusterCIDR":"10.60.0.0/16"%s,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[%s]},
		"backend":{"type":%q,"underlay":"lan0","vni":7,"nodes":[%s]}}]}`,
		extra, filepath.Join(n.Dir, "ipam"), ranges, mode, strings.Join(entries, ",")))
}

func TestStaticPeersAcrossNodes(t *testing.T) {
	for _, mode := range []string{"vxlan", "host-gw", "auto"} {
		t.Run(mode, func(t *testing.T) {
			nodes := staticCluster(t)
			var pods []*Pod
			var addrs [][]string
			for _, n := range nodes {
				p := n.NewPod()
				r := n.MustAdd(n.list(t, mode, nodes, ""), p)
				pods = append(pods, p)
				var a []string
				for _, ipc := range r.IPs {
					a = append(a, ipc.Address.IP.String())
				}
				addrs = append(addrs, a)
				wantMTU := "mtu 1500"
				if mode == "vxlan" || mode == "auto" {
					wantMTU = "mtu 1450"
				}
				if l := testenv.MustIP(t, p.NS, "link", "show", "eth0"); !strings.Contains(l, wantMTU) {
					t.Fatalf("%s pod eth0 should have %s: %s", mode, wantMTU, l)
				}
			}
			for i := range pods {
				for j := range pods {
					if i == j {
						continue
					}
					for _, dst := range addrs[j] {
						must(t, testenv.Ping(pods[i].NS, dst, 2), "%s: pod on node %d -> pod on node %d (%s)", mode, i+1, j+1, dst)
					}
				}
			}
			if mode == "vxlan" {
				// A full-size packet with DF set crosses the overlay.
				out := inNS(t, pods[0].NS, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", "1422", addrs[1][0])
				if !strings.Contains(out, "1 received") {
					t.Fatalf("full-size DF ping: %s", out)
				}
			}
			// Drop node 3 from node 1's list: the next ADD on node 1 removes its route.
			n1 := nodes[0]
			if r := testenv.MustIP(t, n1.NS, "route", "show", "proto", "86"); !strings.Contains(r, "10.60.3.0/24") {
				t.Fatalf("node 1 has no route to node 3's pods: %s", r)
			}
			n1.MustAdd(n1.list(t, mode, nodes[:2], ""), n1.NewPod())
			if r := testenv.MustIP(t, n1.NS, "route", "show", "proto", "86"); strings.Contains(r, "10.60.3.0/24") || !strings.Contains(r, "10.60.2.0/24") {
				t.Fatalf("after node 3 left the list: %s", r)
			}
			// A peer route deleted by hand: CHECK reports it (code 111) and
			// leaves it gone; the next ADD brings it back.
			testenv.MustIP(t, n1.NS, "route", "del", "10.60.2.0/24")
			two := n1.list(t, mode, nodes[:2], "")
			err := n1.Check(two, pods[0])
			var te *types.Error
			if !errors.As(err, &te) || te.Code != village.ErrCodeNodeDrift || !strings.Contains(te.Msg, "10.60.2.0/24") || !strings.Contains(te.Msg, "static peers") {
				t.Fatalf("CHECK with a peer route deleted: %#v, want code %d naming the route", err, village.ErrCodeNodeDrift)
			}
			if r := testenv.MustIP(t, n1.NS, "route", "show", "proto", "86"); strings.Contains(r, "10.60.2.0/24") {
				t.Fatalf("CHECK restored the route (CHECK must not write): %s", r)
			}
			n1.MustAdd(two, n1.NewPod())
			if r := testenv.MustIP(t, n1.NS, "route", "show", "proto", "86"); !strings.Contains(r, "10.60.2.0/24") {
				t.Fatalf("the ADD after CHECK did not restore the route: %s", r)
			}
			must(t, n1.Check(two, pods[0]), "CHECK after the ADD restored the route")
			for i, n := range nodes {
				must(t, n.Del(n.list(t, mode, nodes, ""), pods[i]), "DEL")
			}
		})
	}
}
