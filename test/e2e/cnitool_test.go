package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// TestClassicCnitoolDemo runs cnitool itself with the classic demo config
// from the CNI documentation (cniVersion 0.2.0, bridge cni0, subnet
// 10.22.0.0/16, a default route, a loopback conf) with only the two types
// changed, and checks what a user of that demo sees.
func TestClassicCnitoolDemo(t *testing.T) {
	n := NewNode(t)
	confDir := filepath.Join(n.Dir, "net.d")
	must(t, os.MkdirAll(confDir, 0o755), "mkdir")
	// host-local's default data dir is /var/lib/cni/networks/<name>; keep the
	// demo's exact config but give the network a name no one else uses.
	const classic = `{
	"cniVersion": "0.2.0",
	"name": "mynet-village-e2e",
	"type": "village",
	"bridge": "cni0",
	"isGateway": true,
	"ipMasq": true,
	"ipam": {
		"type": "village-ipam",
		"subnet": "10.22.0.0/16",
		"routes": [
			{ "dst": "0.0.0.0/0" }
		]
	}
}`
	const lo = `{"cniVersion": "0.2.0", "name": "lo", "type": "loopback"}`
	must(t, os.WriteFile(filepath.Join(confDir, "10-mynet.conf"), []byte(classic), 0o644), "write conf")
	must(t, os.WriteFile(filepath.Join(confDir, "99-loopback.conf"), []byte(lo), 0o644), "write conf")
	dataDir := "/var/lib/cni/networks/mynet-village-e2e"
	if _, err := os.Stat(dataDir); err == nil {
		t.Fatalf("%s exists before the test: a previous run leaked it", dataDir)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dataDir) })

	cnitool := filepath.Join(testenv.RefBins(t), "cnitool")
	run := func(args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name(), cnitool}, args...)...)
		cmd.Env = append(os.Environ(), "CNI_PATH="+testenv.CNIPath(t), "NETCONFPATH="+confDir, "CNI_CACHE_DIR="+filepath.Join(n.Dir, "cache"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	pod := n.NewPod()
	out, err := run("add", "mynet-village-e2e", pod.NS.Path())
	must(t, err, "cnitool add: %s", out)
	if !strings.Contains(out, `"ip4"`) || !strings.Contains(out, "10.22.0.2/16") {
		t.Fatalf("cnitool add printed no 0.2.0 result with 10.22.0.2/16:\n%s", out)
	}
	out, err = run("add", "lo", pod.NS.Path())
	must(t, err, "cnitool add lo: %s", out)
	if a := podAddrs(t, pod, "eth0"); !strings.Contains(a, "10.22.0.2/16") {
		t.Fatalf("eth0 in the pod: %s", a)
	}
	if r := testenv.MustIP(t, pod.NS, "route"); !strings.Contains(r, "default via 10.22.0.1 dev eth0") {
		t.Fatalf("pod routes: %s", r)
	}
	if l := testenv.MustIP(t, pod.NS, "-o", "link", "show", "lo"); !strings.Contains(l, "UP") {
		t.Fatalf("lo not up: %s", l)
	}
	must(t, testenv.Ping(n.NS, "10.22.0.2", 2), "node -> pod")
	noneLeft(t, dataDir, "cnitool del", func() {
		out, err = run("del", "mynet-village-e2e", pod.NS.Path())
		must(t, err, "cnitool del: %s", out)
		out, err = run("del", "lo", pod.NS.Path())
		must(t, err, "cnitool del lo: %s", out)
	})
}
