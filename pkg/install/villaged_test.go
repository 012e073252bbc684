package install_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
)

func villaged(t *testing.T, netns string, args ...string) string {
	t.Helper()
	bin := filepath.Join(testenv.Bins(t), "villaged")
	cmd := exec.Command(bin, args...)
	if netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", netns, bin}, args...)...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("villaged %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestVillagedInstallOnAFreshMachine installs from the built binaries into a
// sandbox root, then runs a pod ADD/DEL through libcni with nothing but what
// install put there, then uninstalls.
func TestVillagedInstallOnAFreshMachine(t *testing.T) {
	root := t.TempDir()
	bin, conf, state := filepath.Join(root, "opt/cni/bin"), filepath.Join(root, "etc/cni/net.d"), filepath.Join(root, "var/lib/village")
	tmpl := filepath.Join(root, "village.conflist.tmpl")
	if err := os.WriteFile(tmpl, []byte(`{"cniVersion":"1.1.0","name":"fresh","plugins":[
		{"type":"loopback"},
		{"type":"village","bridge":"vlg-fresh","isGateway":true,"ipMasq":true,"clusterCIDR":"${CLUSTER_CIDR:-10.244.0.0/16}",
		 "ipam":{"type":"village-ipam","dataDir":"${IPAM_DIR}","ranges":[[{"subnet":"${POD_CIDR}"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"install", "--cni-bin-dir", bin, "--cni-conf-dir", conf, "--state-dir", state, "--conf", tmpl,
		"--set", "POD_CIDR=10.77.0.0/24", "--set", "IPAM_DIR=" + filepath.Join(root, "ipam"), "--node-name", "fresh-node"}
	out := villaged(t, "", args...)
	t.Logf("villaged install:\n%s", out)
	for _, want := range []string{"created   " + filepath.Join(bin, "village"), "created   " + filepath.Join(conf, "10-village.conflist")} {
		if !strings.Contains(out, want) {
			t.Errorf("install output lacks %q:\n%s", want, out)
		}
	}
	for _, b := range []string{"village", "village-ipam", "village-ipam-etcd", "village-ipam-kube", "loopback"} {
		got, _ := os.ReadFile(filepath.Join(bin, b))
		want, _ := os.ReadFile(filepath.Join(testenv.Bins(t), b))
		if len(got) == 0 || string(got) != string(want) {
			t.Errorf("%s differs from the built binary", b)
		}
	}
	if again := villaged(t, "", args...); !strings.Contains(again, "nothing changed") {
		t.Errorf("second install:\n%s", again)
	}

	// A pod through exactly what install wrote.
	node, pod := testenv.NewNS(t), testenv.NewNS(t)
	list, err := libcni.ConfListFromFile(filepath.Join(conf, "10-village.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(root, "cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: "fresh-pod", NetNS: pod.Path(), IfName: "eth0"}
	err = testenv.InNS(node, func() error {
		res, err := cni.AddNetworkList(context.Background(), list, rt)
		if err != nil {
			return err
		}
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			return err
		}
		if last := len(cur.IPs) - 1; last < 0 || !strings.HasPrefix(cur.IPs[last].Address.String(), "10.77.0.") {
			t.Errorf("ADD result: %v", cur.IPs)
		}
		return cni.DelNetworkList(context.Background(), list, rt)
	})
	if err != nil {
		t.Fatalf("pod through the installed conflist: %v", err)
	}
	// Masquerade for the network was set up in the node namespace; remove it.
	_ = testenv.InNS(node, func() error { return masq.Teardown("fresh") })

	out = villaged(t, "", "uninstall", "--state-dir", state)
	t.Logf("villaged uninstall:\n%s", out)
	for _, d := range []string{bin, conf} {
		if entries, _ := os.ReadDir(d); len(entries) != 0 {
			t.Errorf("%s not empty after uninstall: %v", d, entries)
		}
	}
}

// TestUninstallPurgeNetwork makes Village's node objects (and some that are
// not Village's) in a test namespace, then runs villaged uninstall
// --purge-network inside it.
func TestUninstallPurgeNetwork(t *testing.T) {
	root := t.TempDir()
	bin, conf, state := filepath.Join(root, "bin"), filepath.Join(root, "conf"), filepath.Join(root, "state")
	tmpl := filepath.Join(root, "t.conflist")
	if err := os.WriteFile(tmpl, []byte(`{"cniVersion":"1.1.0","name":"purge-net","plugins":[
		{"type":"village","bridge":"vlg-purge","clusterCIDR":"10.99.0.0/16",
		 "ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.99.1.0/24"}]]},
		 "macvlan":{"master":"lan0","hostShim":true,"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.77.0/24"}]]}},
		 "backend":{"type":"vxlan","vni":7,"underlay":"lan0"}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	villaged(t, "", "install", "--cni-bin-dir", bin, "--cni-conf-dir", conf, "--state-dir", state, "--conf", tmpl)

	n := testenv.NewNS(t)
	name := filepath.Base(n.Path())
	for _, c := range [][]string{
		{"link", "add", "lan0", "type", "veth", "peer", "name", "lan0p"},
		{"link", "set", "lan0p", "up"},
		{"addr", "add", "192.0.2.1/24", "dev", "lan0"},
		{"link", "set", "lan0", "up"},
		{"link", "add", "vlg-purge", "type", "bridge"},
		{"link", "add", "vshim-lan0", "link", "lan0", "type", "macvlan", "mode", "bridge"},
		{"link", "set", "vshim-lan0", "up"},
		{"link", "add", "village.7", "type", "vxlan", "id", "7", "dstport", "4789", "dev", "lan0"},
		{"link", "add", "village.9", "type", "vxlan", "id", "9", "dstport", "4789", "dev", "lan0"}, // a stale VNI
		{"route", "add", "10.99.2.0/24", "via", "192.0.2.2", "proto", "86"},                        // host-gw peer
		{"route", "add", "192.168.77.0/25", "dev", "vshim-lan0", "proto", "87"},
		// Not Village's: must survive.
		{"link", "add", "keep0", "type", "bridge"},
		{"link", "add", "vshim-notmine", "type", "veth", "peer", "name", "notmine-p"},
		{"route", "add", "10.98.0.0/24", "via", "192.0.2.3", "proto", "static"},
	} {
		testenv.MustIP(t, n, c...)
	}
	podNet := mustCIDR(t, "10.99.1.0/24")
	// Rules in both backends: the nftables table and forward accept rules
	// (in a FORWARD chain with policy drop, as Docker leaves it), and an
	// iptables chain left from before a backend switch.
	nftRun(t, name, "add table ip filter")
	nftRun(t, name, "add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }")
	if err := testenv.InNS(n, func() error {
		return masq.Ensure(masq.Spec{Network: "purge-net", PodSubnets: podNet, Backend: masq.NFTables, ForwardAccept: true})
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", name, "iptables", "-t", "nat", "-N", masq.Chain("purge-net")).CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v %s", err, out)
	}
	if ruleset := nftRun(t, name, "list ruleset"); !strings.Contains(ruleset, "village:purge-net") || !strings.Contains(ruleset, masq.Table("purge-net")) {
		t.Fatalf("rules to purge are not in place:\n%s", ruleset)
	}

	out := villaged(t, name, "uninstall", "--state-dir", state, "--purge-network")
	t.Logf("villaged uninstall --purge-network:\n%s", out)
	links := testenv.MustIP(t, n, "-o", "link", "show")
	for _, gone := range []string{"vlg-purge", "vshim-lan0", "village.7", "village.9"} {
		if strings.Contains(links, " "+gone+":") || strings.Contains(links, " "+gone+"@") {
			t.Errorf("link %s survived the purge", gone)
		}
	}
	for _, kept := range []string{"keep0", "vshim-notmine", "lan0"} {
		if !strings.Contains(links, " "+kept+":") && !strings.Contains(links, " "+kept+"@") {
			t.Errorf("link %s (not Village's) was removed", kept)
		}
	}
	routes := testenv.MustIP(t, n, "route", "show", "table", "all")
	if strings.Contains(routes, "proto 86") || strings.Contains(routes, "proto 87") || strings.Contains(routes, "10.99.2.0") {
		t.Errorf("Village routes survived:\n%s", routes)
	}
	if !strings.Contains(routes, "10.98.0.0/24") {
		t.Errorf("a foreign route was removed:\n%s", routes)
	}
	nat, err := exec.Command("ip", "netns", "exec", name, "iptables", "-t", "nat", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables: %v %s", err, nat)
	}
	if strings.Contains(string(nat), masq.Chain("purge-net")) {
		t.Errorf("masquerade chain survived:\n%s", nat)
	}
	if ruleset := nftRun(t, name, "list ruleset"); strings.Contains(ruleset, "village") || !strings.Contains(ruleset, "policy drop") {
		t.Errorf("after the purge, nftables should keep the foreign FORWARD chain and nothing of Village's:\n%s", ruleset)
	}
	if entries, _ := os.ReadDir(bin); len(entries) != 0 {
		t.Errorf("binaries left: %v", entries)
	}
	if again := villaged(t, name, "uninstall", "--state-dir", state, "--purge-network"); !strings.Contains(again, "nothing changed") {
		t.Errorf("second uninstall:\n%s", again)
	}
}

func mustCIDR(t *testing.T, s string) []*net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return []*net.IPNet{n}
}

func nftRun(t *testing.T, netns, cmd string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", netns, "nft"}, strings.Fields(cmd)...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v %s", cmd, err, out)
	}
	return string(out)
}
