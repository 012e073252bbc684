package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/internal/testenv"
)

// villageList is a single-node conflist: village + village-ipam (dual stack
// when v6 is non-empty), optionally chained with more plugins.
func villageList(n *Node, name, ver, v4, v6 string, extra ...string) string {
	ranges := []string{}
	if v4 != "" {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet":%q}]`, v4))
	}
	if v6 != "" {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet":%q}]`, v6))
	}
	routes := `[{"dst":"0.0.0.0/0"}]`
	if v6 != "" && v4 != "" {
		routes = `[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]`
	} else if v4 == "" {
		routes = `[{"dst":"::/0"}]`
	}
	plugins := []string{fmt.Sprintf(`{"type":"village","bridge":"vlg-%s","isGateway":true,"ipMasq":true,"clusterCIDR":"10.0.0.0/8",
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[%s],"routes":%s}}`,
		name, filepath.Join(n.Dir, "ipam"), strings.Join(ranges, ","), routes)}
	plugins = append(plugins, extra...)
	return fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s]}`, ver, name, strings.Join(plugins, ","))
}

func TestDualStackChainedWithReferenceMetaPlugins(t *testing.T) {
	n := NewNode(t)
	l := ConfList(t, villageList(n, "dual", "1.1.0", "10.31.0.0/24", "fd31::/64",
		`{"type":"portmap","capabilities":{"portMappings":true}}`,
		`{"type":"bandwidth","ingressRate":100000000,"ingressBurst":1000000}`,
		`{"type":"tuning","sysctl":{"net.core.somaxconn":"512"}}`))
	a, b := n.NewPod(), n.NewPod()
	ra := n.MustAdd(l, a)
	rb := n.MustAdd(l, b)
	for _, r := range []*current.Result{ra, rb} {
		if len(r.IPs) != 2 {
			t.Fatalf("want one v4 and one v6 address, got %v", r.IPs)
		}
		if len(r.Interfaces) < 3 || r.Interfaces[2].Name != "eth0" || r.Interfaces[2].Sandbox == "" {
			t.Fatalf("interfaces = %+v, want [bridge, host veth, eth0 in sandbox]", r.Interfaces)
		}
		for _, ipc := range r.IPs {
			if ipc.Interface == nil || *ipc.Interface != 2 {
				t.Fatalf("ips[].interface must point at eth0 (2): %+v", ipc)
			}
		}
	}
	for _, ipc := range rb.IPs {
		must(t, testenv.Ping(a.NS, ipc.Address.IP.String(), 2), "pod a -> pod b %s", ipc.Address.IP)
	}
	must(t, n.Check(l, a), "CHECK right after ADD")
	if got := strings.TrimSpace(inNS(t, a.NS, "sysctl", "-n", "net.core.somaxconn")); got != "512" {
		t.Fatalf("tuning did not run after village: somaxconn=%s", got)
	}
	// Drift: remove the pod's IPv4 address by hand; CHECK must name it.
	addr := ra.IPs[0].Address.String()
	testenv.MustIP(t, a.NS, "addr", "del", addr, "dev", "eth0")
	err := n.Check(l, a)
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("CHECK after removing %s: %v, want an error naming it", addr, err)
	}
	noneLeft(t, filepath.Join(n.Dir, "ipam"), "DEL of both pods", func() {
		must(t, n.Del(l, a), "DEL a")
		must(t, n.Del(l, b), "DEL b")
		must(t, n.Del(l, b), "DEL b twice")
	})
	if out := testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth"); strings.TrimSpace(out) != "" {
		t.Fatalf("veths left on the node: %s", out)
	}
}

func TestEveryCNIVersion(t *testing.T) {
	n := NewNode(t)
	for _, ver := range []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			l := ConfList(t, villageList(n, "v"+strings.ReplaceAll(ver, ".", ""), ver, "10.32.0.0/24", ""))
			p := n.NewPod()
			res, err := n.Add(l, p)
			must(t, err, "ADD")
			if res.Version() != ver {
				t.Fatalf("result version %s, want %s", res.Version(), ver)
			}
			cur, err := current.NewResultFromResult(res)
			must(t, err, "convert")
			if len(cur.IPs) != 1 || !strings.HasPrefix(cur.IPs[0].Address.String(), "10.32.0.") {
				t.Fatalf("result IPs %v", cur.IPs)
			}
			if ver >= "0.4.0" {
				must(t, n.Check(l, p), "CHECK")
			}
			must(t, n.Del(l, p), "DEL")
		})
	}
}

func TestVillageWithReferenceHostLocal(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "hl")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mix1","plugins":[{"type":"village","bridge":"mix1","isDefaultGateway":true,
		"ipam":{"type":"host-local","dataDir":%q,"subnet":"10.33.0.0/24"}}]}`, data))
	a, b := n.NewPod(), n.NewPod()
	n.MustAdd(l, a)
	rb := n.MustAdd(l, b)
	must(t, testenv.Ping(a.NS, rb.IPs[0].Address.IP.String(), 2), "ping")
	must(t, n.Check(l, a), "CHECK")
	noneLeft(t, data, "DEL (host-local)", func() {
		must(t, n.Del(l, a), "DEL")
		must(t, n.Del(l, b), "DEL")
	})
}

func TestReferenceBridgeWithVillageIPAM(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "vi")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mix2","plugins":[{"type":"bridge","bridge":"mix2","isDefaultGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.34.0.0/24"}],[{"subnet":"fd34::/64"}]]}}]}`, data))
	a, b := n.NewPod(), n.NewPod()
	n.MustAdd(l, a)
	rb := n.MustAdd(l, b)
	for _, ipc := range rb.IPs {
		must(t, testenv.Ping(a.NS, ipc.Address.IP.String(), 3), "ping %s", ipc.Address.IP)
	}
	must(t, n.Check(l, a), "CHECK")
	noneLeft(t, data, "DEL (reference bridge, village-ipam)", func() {
		must(t, n.Del(l, a), "DEL")
		must(t, n.Del(l, b), "DEL")
	})
}

func TestRepeatedAddIsIdempotentAndForeignIfnameFails(t *testing.T) {
	n := NewNode(t)
	l := ConfList(t, villageList(n, "rep", "1.1.0", "10.35.0.0/24", "fd35::/64"))
	p := n.NewPod()
	r1 := n.MustAdd(l, p)
	r2 := n.MustAdd(l, p)
	if ipList(r1) != ipList(r2) || r1.Interfaces[2].Mac != r2.Interfaces[2].Mac {
		t.Fatalf("repeated ADD changed the result:\n%v\n%v", r1, r2)
	}
	// Another container asking for eth0 in the same namespace must fail and
	// leave the first container's interface and allocation alone.
	intruder := &Pod{NS: p.NS, ID: "intruder", IfName: "eth0"}
	_, err := n.Add(l, intruder)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("ADD of another container onto an existing eth0: %v, want an 'already exists' error", err)
	}
	must(t, n.Check(l, p), "CHECK of the original after the failed intruder")
	if got := len(ipFiles(t, filepath.Join(n.Dir, "ipam"))); got != 2 {
		t.Fatalf("%d allocations after the failed intruder, want the original's 2", got)
	}
	must(t, n.Del(l, p), "DEL")
}

func TestParallelAddsFillRangeExactly(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	// 10.36.0.0/28 with the gateway .1: .2-.14 = 13 addresses.
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"fill","plugins":[{"type":"village","bridge":"fill","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.36.0.0/28"}]]}}]}`, data))
	const size = 13
	pods := make([]*Pod, size)
	for i := range pods {
		pods[i] = n.NewPod()
	}
	errs := make([]error, size)
	ips := make([]string, size)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res, err := n.Add(l, pods[i])
			errs[i] = err
			if err == nil {
				cur, _ := current.NewResultFromResult(res)
				ips[i] = cur.IPs[0].Address.IP.String()
			}
		}(i)
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, err := range errs {
		must(t, err, "parallel ADD %d", i)
		if seen[ips[i]] {
			t.Fatalf("address %s handed out twice", ips[i])
		}
		seen[ips[i]] = true
	}
	extra := n.NewPod()
	_, err := n.Add(l, extra)
	if err == nil || !strings.Contains(err.Error(), "10.36.0.") {
		t.Fatalf("ADD past exhaustion: %v, want an error naming the range", err)
	}
	if out := testenv.MustIP(t, extra.NS, "-o", "link"); strings.Contains(out, "eth0") {
		t.Fatalf("failed ADD left eth0 behind: %s", out)
	}
	if got := strings.Count(testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth"), "\n"); got != size {
		t.Fatalf("%d veths on the node, want %d (failed ADD must not leave its host veth)", got, size)
	}
	noneLeft(t, data, "DEL of every pod", func() {
		for _, p := range pods {
			must(t, n.Del(l, p), "DEL")
		}
	})
}

func TestDelAfterNetnsGoneReleasesAddress(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := ConfList(t, villageList(n, "gone", "1.1.0", "10.37.0.0/24", ""))
	p := n.NewPod()
	n.MustAdd(l, p)
	if len(ipFiles(t, data)) != 1 {
		t.Fatal("no allocation after ADD")
	}
	sh(t, "ip", "netns", "del", filepath.Base(p.NS.Path()))
	noneLeft(t, data, "DEL with the netns gone", func() {
		must(t, n.Del(l, p), "DEL with the netns gone")
		must(t, n.Del(l, p), "DEL again")
	})
	// Empty CNI_NETNS is also "already gone".
	q := n.NewPod()
	n.MustAdd(l, q)
	noneLeft(t, data, "DEL with an empty CNI_NETNS", func() {
		out := n.Exec(testenv.Call{Bin: "village", Command: "DEL", ContainerID: q.ID, IfName: "eth0",
			Stdin: []byte(`{"cniVersion":"1.1.0","name":"gone","type":"village","bridge":"vlg-gone","ipam":{"type":"village-ipam","dataDir":"` + data + `","ranges":[[{"subnet":"10.37.0.0/24"}]]}}`)})
		if out.ExitCode != 0 {
			t.Fatalf("DEL with empty CNI_NETNS failed: %s %s", out.Stdout, out.Stderr)
		}
	})
}

func TestGCStatusVersion(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	l := ConfList(t, villageList(n, "gc", "1.1.0", "10.38.0.0/24", ""))
	keep, lose := n.NewPod(), n.NewPod()
	n.MustAdd(l, keep)
	n.MustAdd(l, lose)
	must(t, n.Status(l), "STATUS")
	must(t, n.GC(l, keep), "GC")
	left := ipFiles(t, data)
	if len(left) != 1 {
		t.Fatalf("after GC keeping one pod: %v", left)
	}
	b, _ := os.ReadFile(filepath.Join(data, left[0]))
	if !strings.HasPrefix(string(b), keep.ID) {
		t.Fatalf("GC kept the wrong allocation: %q", b)
	}
	// GC with an empty list releases everything.
	noneLeft(t, data, "GC with no valid attachments", func() { must(t, n.GC(l), "GC all") })
	var info interface{ SupportedVersions() []string }
	must(t, n.in(func() error {
		var err error
		info, err = n.CNI.GetVersionInfo(t.Context(), "village")
		return err
	}), "VERSION")
	if got := strings.Join(info.SupportedVersions(), " "); !strings.Contains(got, "0.1.0") || !strings.Contains(got, "1.1.0") {
		t.Fatalf("VERSION lists %s", got)
	}
}

func TestStatusFailsWhenRangeIsFull(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	// /30: network .0, gateway .1, one address .2, broadcast .3.
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"tiny","plugins":[{"type":"village","bridge":"tiny","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.39.0.0/30"}]]}}]}`, data))
	must(t, n.Status(l), "STATUS with room")
	p := n.NewPod()
	n.MustAdd(l, p)
	err := n.Status(l)
	var e *types.Error
	if err == nil || !asCNI(err, &e) || e.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS with the range full: %v, want code 50", err)
	}
	must(t, n.Del(l, p), "DEL")
	must(t, n.Status(l), "STATUS after DEL")
}

func asCNI(err error, e **types.Error) bool {
	te, ok := err.(*types.Error)
	if ok {
		*e = te
	}
	return ok
}

var _ = libcni.CNIConfig{}

func ipList(r *current.Result) string {
	var out []string
	for _, ipc := range r.IPs {
		out = append(out, ipc.Address.String())
	}
	return strings.Join(out, ",")
}

// TestChainedAfterAnotherPlugin puts village second in a chain: its result
// is the previous result plus its own interfaces, indexes shifted.
func TestChainedAfterAnotherPlugin(t *testing.T) {
	n := NewNode(t)
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"chained","plugins":[{"type":"loopback"},
		{"type":"village","bridge":"chained0","isGateway":true,"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.43.0.0/24"}]]}}]}`,
		filepath.Join(n.Dir, "ipam")))
	p := n.NewPod()
	r := n.MustAdd(l, p)
	if len(r.Interfaces) != 4 || r.Interfaces[0].Name != "lo" || r.Interfaces[3].Name != "eth0" {
		t.Fatalf("chained interfaces: %+v", r.Interfaces)
	}
	found := false
	for _, ipc := range r.IPs {
		if ipc.Address.IP.String() == "10.43.0.2" {
			found = ipc.Interface != nil && *ipc.Interface == 3
		}
	}
	if !found {
		t.Fatalf("village's address must point at eth0 (index 3): %+v", r.IPs)
	}
	must(t, n.Check(l, p), "CHECK")
	must(t, n.Del(l, p), "DEL")
}
