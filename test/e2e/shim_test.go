package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/macvlan"
)

// shimNet is a network with a LAN range behind the host shim of lan0.
type shimNet struct {
	name, block string // block: the range's one prefix
	conf        string
	list        *libcni.NetworkConfigList
}

func newShimNet(t *testing.T, n *Node, name, podSubnet, start, end, block string) *shimNet {
	text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":"vlg-%s","isDefaultGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]]},
		"backend":{"type":"none","underlay":"lan0"},
		"macvlan":{"master":"lan0","mode":"bridge","ifName":"net1","hostShim":true,
			"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"192.168.77.0/24","rangeStart":%q,"rangeEnd":%q,"gateway":"192.168.77.1"}]]}}}]}`,
		name, name, filepath.Join(n.Dir, "pods-"+name), podSubnet, filepath.Join(n.Dir, "lan-"+name), start, end)
	s := &shimNet{name: name, block: block, conf: filepath.Join(n.Dir, name+".conflist"), list: ConfList(t, text)}
	must(t, os.WriteFile(s.conf, []byte(text), 0o644), "writing %s", s.conf)
	return s
}

// route is the network's shim route as `ip route` prints it, "" when absent.
func (s *shimNet) route(t *testing.T, n *Node) string {
	out := testenv.MustIP(t, n.NS, "route", "show", "dev", "vshim-lan0", "proto", "87")
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, s.block+" ") && strings.Contains(line, fmt.Sprintf("metric %d", macvlan.ShimMetric(s.name))) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// TestShimFollowsTheNodeAddress: two networks share the host shim of lan0,
// each with its own route (its metric); `villaged status` of one does not
// call the other's route an orphan. The node's LAN address is replaced (a
// DHCP renewal): the kernel drops the routes with the old source; villaged
// of network A puts A's back with the new source (and only A's), the next
// ADD of network B puts B's back; the node reaches both networks' pods from
// its new address. A shim route deleted by hand is back through villaged's
// kernel notifications (period one hour, so notifications are all it has).
func TestShimFollowsTheNodeAddress(t *testing.T) {
	lan := NewLAN(t)
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	a := newShimNet(t, n, "shim-a", "10.52.1.0/24", "192.168.77.200", "192.168.77.203", "192.168.77.200/30")
	b := newShimNet(t, n, "shim-b", "10.53.1.0/24", "192.168.77.208", "192.168.77.211", "192.168.77.208/30")
	pa := n.NewPod()
	ipA := lanIP(t, n.MustAdd(a.list, pa))
	pb := n.NewPod()
	ipB := lanIP(t, n.MustAdd(b.list, pb))
	for _, s := range []*shimNet{a, b} {
		if r := s.route(t, n); !strings.Contains(r, "src 192.168.77.10") {
			t.Fatalf("network %s: shim route %q, want %s with its metric and src 192.168.77.10:\n%s", s.name, r, s.block,
				testenv.MustIP(t, n.NS, "route", "show", "dev", "vshim-lan0"))
		}
	}
	out, err := exec.Command("ip", "netns", "exec", n.Name(), filepath.Join(testenv.Bins(t), "villaged"), "status", "--conf", a.conf, "--node-name", "node1").CombinedOutput()
	if strings.Contains(string(out), "host-shim route") || !strings.Contains(string(out), "network shim-a") {
		t.Fatalf("villaged status of shim-a (%v) judges shim-b's route:\n%s", err, out)
	}

	log, _ := runVillaged(t, n, a.conf, "node1", "1h")
	waitFor(t, 20*time.Second, "villaged has started", func() (bool, string) {
		return strings.Contains(log.String(), "no registry"), log.String()
	})
	// The period is one hour: what follows is villaged reacting to the
	// kernel's address notifications.
	testenv.MustIP(t, n.NS, "addr", "del", "192.168.77.10/24", "dev", "lan0")
	testenv.MustIP(t, n.NS, "addr", "add", "192.168.77.11/24", "dev", "lan0")
	waitFor(t, 20*time.Second, "villaged moves shim-a's route to the new source", func() (bool, string) {
		r := a.route(t, n)
		return strings.Contains(r, "src 192.168.77.11"), r
	})
	if r := b.route(t, n); strings.Contains(r, "192.168.77.11") {
		t.Fatalf("villaged of shim-a wrote shim-b's route: %s", r)
	}
	must(t, testenv.Ping(n.NS, ipA, 2), "node (new address) -> pod of shim-a %s", ipA)

	n.MustAdd(b.list, n.NewPod())
	if r := b.route(t, n); !strings.Contains(r, "src 192.168.77.11") {
		t.Fatalf("ADD of shim-b left its shim route at %q", r)
	}
	must(t, testenv.Ping(n.NS, ipB, 2), "node (new address) -> pod of shim-b %s", ipB)

	// With the period at one hour, only a kernel notification brings it back.
	testenv.MustIP(t, n.NS, "route", "del", a.block, "dev", "vshim-lan0", "proto", "87", "metric", fmt.Sprint(macvlan.ShimMetric(a.name)))
	waitFor(t, 20*time.Second, "villaged restores a deleted shim route from the kernel notification", func() (bool, string) {
		r := a.route(t, n)
		return strings.Contains(r, "src 192.168.77.11"), r
	})
}
