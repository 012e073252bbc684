package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/internal/testenv"
)

// lanPodsNode is a node whose plugins look for the agent socket in a
// directory of the test's (VILLAGE_RUN_DIR), where no agent runs.
func lanPodsNode(t *testing.T) (*Node, string) {
	n := NewNode(t)
	runDir := filepath.Join(n.Dir, "run")
	n.CNI = libcni.NewCNIConfigWithCacheDir(filepath.SplitList(testenv.CNIPath(t)), filepath.Join(n.Dir, "cache"),
		envExec{Exec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}},
			env: []string{"VILLAGE_RUN_DIR=" + runDir}})
	return n, runDir
}

// addArgs is ADD with CNI_ARGS, as podman or a script with cnitool sends them.
func addArgs(n *Node, l *libcni.NetworkConfigList, p *Pod, args ...[2]string) (*current.Result, error) {
	var res *current.Result
	err := n.in(func() error {
		rt := p.rt()
		rt.Args = args
		r, err := n.CNI.AddNetworkList(context.Background(), l, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	})
	return res, err
}

func hasLink(t *testing.T, p *Pod, name string) bool {
	return strings.Contains(testenv.MustIP(t, p.NS, "-o", "link"), ": "+name+"@") ||
		strings.Contains(testenv.MustIP(t, p.NS, "-o", "link"), ": "+name+":")
}

func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// TestLANPodsByCNIArgs: "macvlan.pods": "annotated" outside Kubernetes.
// Only pods whose CNI_ARGS ask (VILLAGE_LAN=true, VILLAGE_LAN_IP=) get net1;
// a requested address is claimed exactly, refused when taken or outside
// the pool, and released by DEL; the pod announces its address as net1
// comes up (the LAN host's stale neighbour entry is corrected before the
// host sends anything); a Kubernetes pod's ADD with no agent running fails
// naming the agent's socket.
func TestLANPodsByCNIArgs(t *testing.T) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", "192.168.77.5/24")
	n, runDir := lanPodsNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	conf := strings.Replace(lanList(n, "lanpods", "10.52.1.0/24", "192.168.77.200", "192.168.77.203", ""),
		`"hostShim":true,`, `"hostShim":true,"pods":"annotated",`, 1)
	if !strings.Contains(conf, `"annotated"`) {
		t.Fatal("conflist without pods annotated")
	}
	l := ConfList(t, conf)
	lanDir := filepath.Join(n.Dir, "lan", "lanpods")
	const fixed = "192.168.77.202"

	plain := n.NewPod()
	r := n.MustAdd(l, plain)
	for _, ifc := range r.Interfaces {
		if ifc.Name == "net1" {
			t.Fatalf("a pod that did not ask got net1: %+v", r)
		}
	}
	if hasLink(t, plain, "net1") || !hasLink(t, plain, "eth0") {
		t.Fatalf("links of a pod that did not ask: %s", testenv.MustIP(t, plain.NS, "-o", "link"))
	}
	must(t, n.Check(l, plain), "CHECK of a pod without LAN")

	asks := n.NewPod()
	r, err := addArgs(n, l, asks, [2]string{"VILLAGE_LAN", "true"})
	must(t, err, "ADD with VILLAGE_LAN=true")
	ip := lanIP(t, r)
	if !strings.HasPrefix(ip, "192.168.77.20") || ip == fixed {
		t.Fatalf("LAN address %s, want one of the pool other than %s", ip, fixed)
	}
	must(t, testenv.Ping(host, ip, 2), "LAN host -> pod %s", ip)

	// A stale entry for the fixed address with another MAC: only the pod's
	// own announcement can correct it before the host sends anything.
	testenv.MustIP(t, host, "neigh", "replace", fixed, "lladdr", "02:00:00:00:00:01", "dev", "eth0", "nud", "stale")
	pinned := n.NewPod()
	r, err = addArgs(n, l, pinned, [2]string{"VILLAGE_LAN_IP", fixed})
	must(t, err, "ADD with VILLAGE_LAN_IP=%s", fixed)
	if got := lanIP(t, r); got != fixed {
		t.Fatalf("LAN address %s, want exactly %s", got, fixed)
	}
	mac := ""
	for _, ifc := range r.Interfaces {
		if ifc.Name == "net1" {
			mac = ifc.Mac
		}
	}
	waitFor(t, 10*time.Second, "the LAN host's neighbour entry of "+fixed+" updated by the pod's gratuitous ARP", func() (bool, string) {
		out := testenv.MustIP(t, host, "neigh", "show", fixed, "dev", "eth0")
		return strings.Contains(out, mac), fmt.Sprintf("neighbour entry %q, want lladdr %s", out, mac)
	})
	must(t, testenv.Ping(host, fixed, 2), "LAN host -> pinned pod")
	must(t, n.Check(l, pinned), "CHECK of the pinned pod")

	dup := n.NewPod()
	_, err = addArgs(n, l, dup, [2]string{"VILLAGE_LAN_IP", fixed})
	if err == nil || cniCode(err) != 101 || !strings.Contains(err.Error(), fixed) {
		t.Fatalf("ADD asking for the taken %s: %v (code %d), want code 101 naming it", fixed, err, cniCode(err))
	}
	if hasLink(t, dup, "eth0") || hasLink(t, dup, "net1") {
		t.Fatalf("refused ADD left links: %s", testenv.MustIP(t, dup.NS, "-o", "link"))
	}
	outside := n.NewPod()
	_, err = addArgs(n, l, outside, [2]string{"VILLAGE_LAN_IP", "192.168.77.50"})
	if err == nil || !strings.Contains(err.Error(), "outside the LAN pool") || !strings.Contains(err.Error(), "192.168.77.200-192.168.77.203") {
		t.Fatalf("ADD asking for an address outside the pool: %v, want the pool named", err)
	}
	_, err = addArgs(n, l, n.NewPod(), [2]string{"VILLAGE_LAN_IP", "not-an-ip"})
	if cniCode(err) != types.ErrInvalidEnvironmentVariables || !strings.Contains(err.Error(), "VILLAGE_LAN_IP") {
		t.Fatalf("ADD with a bad VILLAGE_LAN_IP: %v, want code 4 naming the key", err)
	}
	// A Kubernetes pod's request comes from the agent; with none running the
	// ADD says which socket it tried, and kubelet may retry (code 11).
	_, err = addArgs(n, l, n.NewPod(), [2]string{"IgnoreUnknown", "1"}, [2]string{"K8S_POD_NAMESPACE", "default"}, [2]string{"K8S_POD_NAME", "web-0"})
	if sock := filepath.Join(runDir, "agent.sock"); err == nil || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "villaged") || cniCode(err) != types.ErrTryAgainLater {
		t.Fatalf("ADD of a Kubernetes pod with no agent: %v (code %d), want code 11 naming %s and villaged", err, cniCode(err), sock)
	}

	if _, err := os.Stat(filepath.Join(lanDir, fixed)); err != nil {
		t.Fatalf("the pool holds no record of %s: %v", fixed, err)
	}
	must(t, n.Del(l, pinned), "DEL of the pinned pod")
	if _, err := os.Stat(filepath.Join(lanDir, fixed)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("DEL left the allocation of %s: %v", fixed, err)
	}
	r, err = addArgs(n, l, dup, [2]string{"VILLAGE_LAN_IP", fixed})
	must(t, err, "ADD asking for %s after its DEL", fixed)
	if got := lanIP(t, r); got != fixed {
		t.Fatalf("LAN address %s after DEL, want %s", got, fixed)
	}
	for _, p := range []*Pod{plain, asks, dup} {
		must(t, n.Del(l, p), "DEL")
	}
	if ents, _ := os.ReadDir(lanDir); len(ipNames(ents)) != 0 {
		t.Fatalf("LAN pool after every DEL: %v", ipNames(ents))
	}
}

func ipNames(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "192.") {
			out = append(out, e.Name())
		}
	}
	return out
}
