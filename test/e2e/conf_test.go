package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/village-cni/village/internal/testenv"
	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/netconf"
)

func confDir(t *testing.T) string {
	root, err := testenv.ModuleRoot()
	must(t, err, "module root")
	return filepath.Join(root, "conf")
}

// TestConfExamplesParse loads every example in conf/ the way a runtime does
// and through Village's own parsers.
func TestConfExamplesParse(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(confDir(t), "*.conf*"))
	must(t, err, "glob")
	if len(paths) < 5 {
		t.Fatalf("only %d examples in conf/", len(paths))
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			var list *libcni.NetworkConfigList
			var err error
			if strings.HasSuffix(p, ".conflist") {
				list, err = libcni.ConfListFromFile(p)
			} else {
				var c *libcni.PluginConfig
				if c, err = libcni.ConfFromFile(p); err == nil {
					list, err = libcni.ConfListFromConf(c)
				}
			}
			must(t, err, "libcni")
			for _, pl := range list.Plugins {
				if pl.Network.Type != "village" {
					continue
				}
				full, err := libcni.InjectConf(pl, map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
				must(t, err, "inject")
				conf, err := netconf.Parse(full.Bytes, "")
				must(t, err, "netconf.Parse")
				ipamRaw, _ := json.Marshal(map[string]any{"cniVersion": list.CNIVersion, "name": list.Name, "ipam": json.RawMessage(mustIPAM(t, pl.Bytes))})
				if conf.Overlay.Registry == nil { // registry examples take their range from villaged
					_, err = ipamconfig.Parse(ipamRaw, "")
					must(t, err, "ipam config")
				}
			}
		})
	}
}

func mustIPAM(t *testing.T, b []byte) []byte {
	var m map[string]json.RawMessage
	must(t, json.Unmarshal(b, &m), "decode")
	return m["ipam"]
}

// withDataDir returns an example with every ipam block's dataDir set and the
// pod subnet swapped (each node of a static example has its own).
func withDataDir(t *testing.T, path, dataDir, subnet string) *libcni.NetworkConfigList {
	b, err := os.ReadFile(path)
	must(t, err, "read %s", path)
	s := strings.Replace(string(b), `"type": "village-ipam",`, fmt.Sprintf(`"type": "village-ipam", "dataDir": %q,`, dataDir), -1)
	s = strings.Replace(s, `"ranges": [[{ "subnet": "10.244.1.0/24" }]]`, fmt.Sprintf(`"ranges": [[{ "subnet": %q }]]`, subnet), 1)
	return ConfList(t, s)
}

// TestConfStaticExamplesRun runs the static vxlan, host-gw and auto
// examples unchanged but for the data dir and each node's pod subnet, on
// three namespace nodes whose underlay is called eth0 and carries the
// addresses the examples name.
func TestConfStaticExamplesRun(t *testing.T) {
	for _, file := range []string{"30-village-vxlan-static.conflist", "31-village-hostgw-static.conflist", "32-village-auto-static.conflist"} {
		t.Run(file, func(t *testing.T) {
			lan := NewLAN(t)
			var nodes []*Node
			var ips []string
			for i := 1; i <= 3; i++ {
				n := NewNode(t)
				lan.Attach(t, n.NS, "eth0", fmt.Sprintf("192.168.50.1%d/24", i))
				nodes = append(nodes, n)
			}
			for i, n := range nodes {
				l := withDataDir(t, filepath.Join(confDir(t), file), filepath.Join(n.Dir, "ipam"), fmt.Sprintf("10.244.%d.0/24", i+1))
				r := n.MustAdd(l, n.NewPod())
				ips = append(ips, r.IPs[0].Address.IP.String())
			}
			// Pod on node 1 reaches the pods on nodes 2 and 3.
			p := nodes[0].NewPod()
			nodes[0].MustAdd(withDataDir(t, filepath.Join(confDir(t), file), filepath.Join(nodes[0].Dir, "ipam"), "10.244.1.0/24"), p)
			for _, ip := range ips[1:] {
				must(t, testenv.Ping(p.NS, ip, 2), "%s: pod on node1 -> %s", file, ip)
			}
		})
	}
}
