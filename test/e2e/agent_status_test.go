package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
)

// TestAgentStatusListsOrphans: `villaged status` names what Village owns on
// a node that nothing wants: an allocation whose pod is gone, a host veth no
// allocation accounts for, a masquerade chain nothing jumps to.
func TestAgentStatusListsOrphans(t *testing.T) {
	nodes := staticCluster(t)
	n1 := nodes[0]
	l := n1.list(t, "vxlan", nodes, "")
	conf := filepath.Join(n1.Dir, "ovl.conflist")
	must(t, os.WriteFile(conf, l.Bytes, 0o600), "write conflist")
	run := func() (string, error) {
		cmd := exec.Command("ip", "netns", "exec", n1.Name(), filepath.Join(testenv.Bins(t), "villaged"), "status", "--conf", conf, "--node-name", "node-"+n1.ip)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	a, b := n1.NewPod(), n1.NewPod()
	n1.MustAdd(l, a)
	rb := n1.MustAdd(l, b)
	out, err := run()
	if err != nil || !strings.Contains(out, "status: in sync") || strings.Contains(out, "orphan") {
		t.Fatalf("status of a clean node: %v\n%s", err, out)
	}

	data := filepath.Join(n1.Dir, "ipam", "ovl")
	// A DEL that never came: an allocation whose pod interface is gone.
	must(t, os.WriteFile(filepath.Join(data, "10.60.1.200"), []byte("ghost-container\r\neth0"), 0o600), "write allocation")
	// Allocations released behind a live pod's back: its veth is unaccounted.
	for _, ipc := range rb.IPs {
		must(t, os.Remove(filepath.Join(data, ipc.Address.IP.String())), "remove allocation of pod b")
	}
	// A masquerade chain nothing jumps to.
	inNS(t, n1.NS, "iptables", "-t", "nat", "-N", masq.Chain("gone-network"))

	out, err = run()
	if err == nil {
		t.Fatalf("status with orphans exited 0:\n%s", out)
	}
	for _, want := range []string{
		"orphan: allocation 10.60.1.200 of container ghost-container interface eth0",
		"orphan: host veth " + rb.Interfaces[1].Name,
		"orphan: masquerade chain " + masq.Chain("gone-network"),
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("status does not list %q:\n%s", want, out)
		}
	}
}
