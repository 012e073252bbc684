package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
)

// LAN is a home/office network made of namespaces: a namespace holding a
// bridge, with nodes and hosts attached to it by veth pairs.
type LAN struct {
	NS    ns.NetNS
	ports int
}

func NewLAN(t testing.TB) *LAN {
	t.Helper()
	l := &LAN{NS: testenv.NewNS(t)}
	testenv.MustIP(t, l.NS, "link", "add", "lanbr", "type", "bridge")
	testenv.MustIP(t, l.NS, "link", "set", "lanbr", "up")
	return l
}

// Attach connects n to the LAN with an interface named ifName holding addr
// (CIDR notation; empty for none).
func (l *LAN) Attach(t testing.TB, n ns.NetNS, ifName, addr string) {
	t.Helper()
	l.ports++
	port := fmt.Sprintf("p%d", l.ports)
	testenv.MustIP(t, l.NS, "link", "add", port, "type", "veth", "peer", "name", ifName, "netns", filepath.Base(n.Path()))
	testenv.MustIP(t, l.NS, "link", "set", port, "master", "lanbr", "up")
	if addr != "" {
		testenv.MustIP(t, n, "addr", "add", addr, "dev", ifName)
	}
	testenv.MustIP(t, n, "link", "set", ifName, "up")
}

func lanList(n *Node, name, podSubnet, lanStart, lanEnd, lanStore string) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":"vlg-%s","isDefaultGateway":true,"ipMasq":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]]},
		"macvlan":{"master":"lan0","mode":"bridge","ifName":"net1","hostShim":true,
			"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"192.168.77.0/24","rangeStart":%q,"rangeEnd":%q,"gateway":"192.168.77.1"}]]%s}}}]}`,
		name, name, filepath.Join(n.Dir, "pods"), podSubnet, filepath.Join(n.Dir, "lan"), lanStart, lanEnd, lanStore)
}

// lanIP returns the address the result gives the LAN interface.
func lanIP(t *testing.T, r *current.Result) string {
	t.Helper()
	for i, iface := range r.Interfaces {
		if iface.Name != "net1" {
			continue
		}
		for _, ipc := range r.IPs {
			if ipc.Interface != nil && *ipc.Interface == i {
				return ipc.Address.IP.String()
			}
		}
	}
	t.Fatalf("result has no net1 address: %+v", r)
	return ""
}

func TestMacvlanOnTheLAN(t *testing.T) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", "192.168.77.5/24")
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	l := ConfList(t, lanList(n, "lan", "10.50.1.0/24", "192.168.77.200", "192.168.77.203", ""))

	pods := []*Pod{n.NewPod(), n.NewPod()}
	var ips []string
	for _, p := range pods {
		r := n.MustAdd(l, p)
		ip := lanIP(t, r)
		if !strings.HasPrefix(ip, "192.168.77.20") {
			t.Fatalf("LAN address %s outside the range", ip)
		}
		ips = append(ips, ip)
		if rt := testenv.MustIP(t, p.NS, "route", "show", "default"); !strings.Contains(rt, "dev eth0") {
			t.Fatalf("default route left eth0: %s", rt)
		}
	}
	for _, ip := range ips {
		must(t, testenv.Ping(host, ip, 2), "LAN host -> pod LAN address %s", ip)
		must(t, testenv.Ping(n.NS, ip, 2), "node -> its own pod's LAN address %s through the shim", ip)
	}
	must(t, n.Check(l, pods[0]), "CHECK with a LAN interface")
	testenv.MustIP(t, pods[0].NS, "addr", "flush", "dev", "net1")
	if err := n.Check(l, pods[0]); err == nil || !strings.Contains(err.Error(), "net1") {
		t.Fatalf("CHECK after flushing net1: %v, want drift naming net1", err)
	}
	noneLeft(t, filepath.Join(n.Dir, "lan"), "DEL of the LAN pods", func() {
		for _, p := range pods {
			must(t, n.Del(l, p), "DEL")
		}
	})
	if out := testenv.MustIP(t, n.NS, "-o", "link", "show", "vshim-lan0"); !strings.Contains(out, "vshim-lan0") {
		t.Fatalf("the host shim must stay until uninstall: %s", out)
	}
}

func TestMacvlanExhaustionLeavesNothing(t *testing.T) {
	lan := NewLAN(t)
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	l := ConfList(t, lanList(n, "lanx", "10.51.1.0/24", "192.168.77.200", "192.168.77.201", ""))
	pods := []*Pod{n.NewPod(), n.NewPod(), n.NewPod()}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func(i int) { defer wg.Done(); _, errs[i] = n.Add(l, pods[i]) }(i)
	}
	wg.Wait()
	for _, err := range errs {
		must(t, err, "parallel ADD")
	}
	_, err := n.Add(l, pods[2])
	if err == nil || !strings.Contains(err.Error(), "192.168.77.200") {
		t.Fatalf("ADD past LAN exhaustion: %v, want an error naming the LAN range", err)
	}
	if out := testenv.MustIP(t, pods[2].NS, "-o", "link"); strings.Contains(out, "eth0") || strings.Contains(out, "net1") {
		t.Fatalf("failed ADD left interfaces: %s", out)
	}
	if got := len(ipFiles(t, filepath.Join(n.Dir, "pods"))); got != 2 {
		t.Fatalf("%d pod-range allocations after the failed ADD, want 2 (its eth0 address must be released)", got)
	}
	// Master missing: a clear error naming it.
	bad := ConfList(t, strings.Replace(string(l.Bytes), `"master":"lan0"`, `"master":"nosuch0"`, 1))
	_, err = n.Add(bad, pods[2])
	var e *types.Error
	if err == nil || !strings.Contains(err.Error(), "nosuch0") {
		t.Fatalf("ADD with a missing master: %v (%v), want an error naming nosuch0", err, e)
	}
	noneLeft(t, filepath.Join(n.Dir, "lan"), "DEL of the LAN pods", func() {
		for _, p := range pods {
			must(t, n.Del(l, p), "DEL")
		}
	})
}
