package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/village-cni/village/internal/testenv"
)

// TestStatusAfterMigratingFromTheReferenceBridge: a node ran the reference
// bridge with host-local; its conflist is switched to Village on the same
// bridge and data directory while those pods live. `villaged status` lists
// them (their veths and allocations) as not Village's, not as orphans, and
// is in sync; a Village pod whose namespace went away without a DEL is an
// orphan, and only it.
func TestStatusAfterMigratingFromTheReferenceBridge(t *testing.T) {
	n := NewNode(t)
	testenv.MustIP(t, n.NS, "link", "add", "lan0", "type", "veth", "peer", "name", "lan0p")
	testenv.MustIP(t, n.NS, "addr", "add", "192.168.91.1/24", "dev", "lan0")
	testenv.MustIP(t, n.NS, "link", "set", "lan0", "up")
	data := filepath.Join(n.Dir, "ipam")
	ref := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mig","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,
		"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.78.0.0/24"}]]}}]}`, data))
	var refIPs []string
	var refPods []*Pod
	for range 2 {
		p := n.NewPod()
		r := n.MustAdd(ref, p)
		refPods = append(refPods, p)
		refIPs = append(refIPs, r.IPs[0].Address.IP.String())
	}
	text := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mig","plugins":[{"type":"village","bridge":"cni0","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.78.0.0/24"}]]},
		"backend":{"type":"none","underlay":"lan0"}}]}`, data)
	conf := filepath.Join(n.Dir, "mig.conflist")
	must(t, os.WriteFile(conf, []byte(text), 0o644), "writing the conflist")
	vl := ConfList(t, text)
	vp := n.NewPod()
	vIP := n.MustAdd(vl, vp).IPs[0].Address.IP.String()
	for _, ip := range refIPs {
		if ip == vIP {
			t.Fatalf("Village handed out %s, held by a reference-bridge pod", ip)
		}
		must(t, testenv.Ping(vp.NS, ip, 2), "Village pod -> reference-bridge pod %s on the same bridge", ip)
	}
	status := func() (string, error) {
		out, err := exec.Command("ip", "netns", "exec", n.Name(), filepath.Join(testenv.Bins(t), "villaged"),
			"status", "--conf", conf, "--node-name", "node1").CombinedOutput()
		return string(out), err
	}
	out, err := status()
	if err != nil || !strings.Contains(out, "status: in sync") || strings.Contains(out, "orphan:") {
		t.Fatalf("status with live reference-bridge pods: %v\n%s", err, out)
	}
	for i, ip := range refIPs {
		if !strings.Contains(out, "not Village's: allocation "+ip+" of container "+refPods[i].ID) ||
			!strings.Contains(out, "(pod addresses "+ip+"): made by another plugin") {
			t.Fatalf("status does not name reference-bridge pod %s (%s) as not Village's:\n%s", refPods[i].ID, ip, out)
		}
	}
	if strings.Contains(out, vIP) {
		t.Fatalf("status lists the live Village pod %s:\n%s", vIP, out)
	}

	// A Village pod whose namespace is removed without a DEL.
	gone := n.NewPod()
	goneIP := n.MustAdd(vl, gone).IPs[0].Address.IP.String()
	must(t, gone.NS.Close(), "closing the pod namespace")
	must(t, testutils.UnmountNS(gone.NS), "removing the pod namespace")
	waitFor(t, 60*time.Second, "the pod's veth goes with its namespace (namespace teardown is asynchronous)", func() (bool, string) {
		o, _ := testenv.IP(n.NS, "-o", "link", "show", "master", "cni0")
		return strings.Count(o, "veth") == 3, o
	})
	out, err = status()
	if err == nil || !strings.Contains(out, "orphan: allocation "+goneIP+" of container "+gone.ID) || strings.Count(out, "orphan:") != 1 {
		t.Fatalf("status after a Village pod vanished: %v, want exactly one orphan, %s:\n%s", err, goneIP, out)
	}
	noneLeft(t, filepath.Join(data, "mig"), "DEL of every pod", func() {
		for _, p := range refPods {
			must(t, n.Del(ref, p), "reference DEL")
		}
		must(t, n.Del(vl, vp), "DEL")
		must(t, n.Del(vl, gone), "DEL of the vanished pod")
	})
}
