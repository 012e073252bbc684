package e2e

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
)

// routeLines lists every route of the node in all tables, both families.
func routeLines(t *testing.T, n *Node) []string {
	t.Helper()
	var out []string
	for _, fam := range []string{"-4", "-6"} {
		for _, l := range strings.Split(testenv.MustIP(t, n.NS, fam, "route", "show", "table", "all"), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, fam+" "+l)
			}
		}
	}
	return out
}

func iptablesSave(t *testing.T, n *Node) []string {
	t.Helper()
	var out []string
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		for _, l := range strings.Split(inNS(t, n.NS, tool), "\n") {
			if strings.HasPrefix(l, "-A ") || strings.HasPrefix(l, ":") {
				// Chain lines carry counters; keep the name and policy.
				if strings.HasPrefix(l, ":") {
					l = strings.Fields(l)[0]
				}
				out = append(out, tool+" "+l)
			}
		}
	}
	return out
}

// TestEverythingVillageAddsIsTagged runs ADD with every feature that
// touches the node (bridge gateway, masquerade in both families, a macvlan
// LAN interface with a host shim, an auto backend with one peer on the LAN
// and one behind a router) and checks the node afterwards: every route it
// added carries protocol 86 (overlay) or 87 (host shim) — the kernel's own
// connected routes aside — and every iptables rule it added carries the
// network's owner comment, in either netfilter backend. DEL then removes
// every per-pod piece.
func TestEverythingVillageAddsIsTagged(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) { everythingTagged(t, backend) })
	}
}

// nftRules lists the rule lines of the node's nftables ruleset with the
// table and chain each is in, counters removed.
func nftRules(t *testing.T, n *Node) []string {
	t.Helper()
	var out []string
	var table, chain string
	for _, l := range strings.Split(inNS(t, n.NS, "nft", "list", "ruleset"), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "table "):
			table = strings.TrimSuffix(l, " {")
		case strings.HasPrefix(l, "chain "):
			chain = strings.TrimSuffix(l, " {")
		case l == "" || l == "}" || strings.HasPrefix(l, "type ") || strings.HasPrefix(l, "#"):
		default:
			out = append(out, table+" "+chain+": "+nftCounters.ReplaceAllString(l, "counter"))
		}
	}
	return out
}

func everythingTagged(t *testing.T, backend string) {
	lan := NewLAN(t)
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.79.10/24")
	testenv.MustIP(t, n.NS, "-6", "addr", "add", "fd79::10/64", "dev", "lan0", "nodad")
	testenv.MustIP(t, n.NS, "route", "add", "default", "via", "192.168.79.1")
	// FORWARD policy drop, as Docker leaves it: forwardAccept adds rules too.
	inNS(t, n.NS, "iptables", "-P", "FORWARD", "DROP")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"tagged","plugins":[{"type":"village","bridge":"tag0","isDefaultGateway":true,
		"ipMasq":true,"clusterCIDR":"10.72.0.0/16","ipMasqBackend":%q,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.72.1.0/24"}],[{"subnet":"fd72:0:0:1::/64"}]]},
		"macvlan":{"master":"lan0","mode":"bridge","ifName":"net1","hostShim":true,
			"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"192.168.79.0/24","rangeStart":"192.168.79.200","rangeEnd":"192.168.79.210","gateway":"192.168.79.1"}]]}},
		"backend":{"type":"auto","underlay":"lan0","vni":9,"nodes":[
			{"name":"near","ip":"192.168.79.11","podCIDRs":["10.72.2.0/24","fd72:0:0:2::/64"]},
			{"name":"far","ip":"192.168.200.5","podCIDRs":["10.72.3.0/24","fd72:0:0:3::/64"]}]}}]}`,
		backend, filepath.Join(n.Dir, "pods"), filepath.Join(n.Dir, "lan")))
	routesBefore := routeLines(t, n)
	rulesBefore := iptablesSave(t, n)
	nftBefore := nftRules(t, n)

	pods := []*Pod{n.NewPod(), n.NewPod()}
	for _, p := range pods {
		n.MustAdd(l, p)
	}
	var bad []string
	var tagged86, tagged87 int
	for _, r := range routeLines(t, n) {
		if slices.Contains(routesBefore, r) {
			continue
		}
		switch {
		case strings.Contains(r, "proto 86"):
			tagged86++
		case strings.Contains(r, "proto 87"):
			tagged87++
		case strings.Contains(r, "proto kernel"):
			// connected and local routes the kernel makes for an address
		default:
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		t.Errorf("routes Village added without its protocol (86 overlay, 87 host shim):\n%s", strings.Join(bad, "\n"))
	}
	if tagged86 == 0 || tagged87 == 0 {
		t.Errorf("found %d overlay and %d shim routes: the setup did not exercise both", tagged86, tagged87)
	}
	bad = nil
	var rules int
	for _, r := range iptablesSave(t, n) {
		if slices.Contains(rulesBefore, r) || !strings.HasPrefix(strings.Fields(r)[1], "-A") {
			continue
		}
		rules++
		if !strings.Contains(r, `--comment village:tagged`) && !strings.Contains(r, `--comment "village:tagged"`) {
			bad = append(bad, r)
		}
	}
	if len(bad) > 0 {
		t.Errorf("iptables rules Village added without the owner comment:\n%s", strings.Join(bad, "\n"))
	}
	if backend == "iptables" && rules == 0 {
		t.Error("ADD with ipMasq added no iptables rule: nothing was checked")
	}
	if backend == "nftables" {
		// iptables-save above saw the accept rules in iptables-nft's FORWARD
		// chain (tagged); count everything from nft's side now.
		bad, rules = nil, 0
		for _, r := range nftRules(t, n) {
			if slices.Contains(nftBefore, r) {
				continue
			}
			rules++
			if !strings.Contains(r, `comment "village:tagged"`) {
				bad = append(bad, r)
			}
		}
		if len(bad) > 0 {
			t.Errorf("nftables rules Village added without the owner comment:\n%s", strings.Join(bad, "\n"))
		}
		if rules < 7 { // 3 + 2 masquerade, 2 x 2 forward accept
			t.Errorf("the nftables backend added %d rules, want masquerade and forward accept in both families", rules)
		}
	}
	t.Logf("%d overlay routes (86), %d shim routes (87), %d %s rules, all tagged", tagged86, tagged87, rules, backend)
	if t.Failed() {
		t.FailNow()
	}
	// Both ranges hold allocations before the DELs and none after.
	lanBefore := ipFiles(t, filepath.Join(n.Dir, "lan"))
	if len(lanBefore) == 0 {
		t.Fatalf("no LAN allocation under %s before the DELs: nothing to prove gone", filepath.Join(n.Dir, "lan"))
	}
	noneLeft(t, filepath.Join(n.Dir, "pods"), "DEL of every pod", func() {
		for _, p := range pods {
			must(t, n.Del(l, p), "DEL")
		}
	})
	if left := ipFiles(t, filepath.Join(n.Dir, "lan")); len(left) != 0 {
		t.Fatalf("LAN allocations left: %v (of %v)", left, lanBefore)
	}
	if out := testenv.MustIP(t, n.NS, "-o", "link", "show", "type", "veth"); strings.Count(out, "\n") != 1 { // lan0 only
		t.Fatalf("veths left after DEL: %s", out)
	}
}

// TestStoreModes checks the disk store's files and directories after real
// ADDs, DELs and a GC: directories 0700, files 0600, no matter the umask of
// the runtime.
func TestStoreModes(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "fresh", "ipam") // the plugin makes every level
	l := simpleList(t, "modes", "modes0", "10.73.0.0/24", data)
	p, q := n.NewPod(), n.NewPod()
	n.MustAdd(l, p)
	n.MustAdd(l, q)
	must(t, n.Del(l, p), "DEL")
	must(t, n.GC(l, q), "GC")
	var checked int
	err := filepath.WalkDir(filepath.Join(n.Dir, "fresh"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		checked++
		switch {
		case fi.IsDir() && fi.Mode().Perm() != 0o700:
			t.Errorf("directory %s is %o, want 700", path, fi.Mode().Perm())
		case fi.Mode().IsRegular() && fi.Mode().Perm() != 0o600:
			t.Errorf("file %s is %o, want 600", path, fi.Mode().Perm())
		case !fi.IsDir() && !fi.Mode().IsRegular():
			t.Errorf("%s is a %s, neither a file nor a directory", path, fi.Mode().Type())
		}
		return nil
	})
	must(t, err, "walk")
	if checked < 6 { // fresh, ipam, modes, lock, a record, a marker, .village...
		t.Fatalf("only %d entries in the store: nothing was checked", checked)
	}
	if fi, err := os.Stat("/run/village/masq.lock"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("/run/village/masq.lock: %v %v, want a 0600 file", fi, err)
	}
	if fi, err := os.Stat("/run/village"); err != nil || fi.Mode().Perm()&0o022 != 0 {
		t.Errorf("/run/village: %v %v, want no group/other write", fi, err)
	}
}

// TestEtcdTLSThroughTheBinary runs village-ipam against an etcd that
// requires client certificates: with the right CA and certificate ADD
// works; with no certificate, or a CA that did not sign the server, it
// fails with a CNI error that says why, and allocates nothing.
func TestEtcdTLSThroughTheBinary(t *testing.T) {
	srv := etcdtest.StartTLS(t)
	pod := testenv.NewNS(t)
	conf := func(ca, cert, key string) []byte {
		store := map[string]any{"type": "etcd", "endpoints": srv.Endpoints, "prefix": "/tls", "nodeName": "n1", "caFile": ca, "certFile": cert, "keyFile": key}
		b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "tls", "ipam": map[string]any{"type": "village-ipam",
			"ranges": []any{[]any{map[string]any{"subnet": "10.74.0.0/24"}}}, "store": store}})
		must(t, err, "marshal")
		return b
	}
	c := srv.TLS
	run := func(id string, stdin []byte) testenv.Output {
		return testenv.Exec(t, testenv.Call{Bin: filepath.Join(testenv.Bins(t), "village-ipam"), Command: "ADD", ContainerID: id, IfName: "eth0",
			Netns: pod.Path(), Path: testenv.CNIPath(t), Stdin: stdin})
	}
	if out := run("good", conf(c.CAFile, c.ClientCertFile, c.ClientKeyFile)); out.ExitCode != 0 {
		t.Fatalf("ADD over TLS with the right certificates: %s %s", out.Stdout, out.Stderr)
	}
	for _, bad := range []struct {
		name, ca, cert, key string
		says                string
	}{
		{"no client certificate", c.CAFile, "", "", "certificate"},
		{"wrong CA", c.OtherCAFile, c.ClientCertFile, c.ClientKeyFile, "certificate"},
		{"client certificate of another CA", c.CAFile, c.OtherClientCertFile, c.OtherClientKeyFile, "certificate"},
		{"missing CA file", "/nonexistent/ca.pem", c.ClientCertFile, c.ClientKeyFile, "/nonexistent/ca.pem"},
	} {
		out := run("bad", conf(bad.ca, bad.cert, bad.key))
		e := CNIError(t, out)
		if !strings.Contains(e.Msg+e.Details, bad.says) {
			t.Errorf("%s: code %d %q, want a message mentioning %q", bad.name, e.Code, e.Msg, bad.says)
		}
		if e.Code == 0 || e.Code == types.ErrDecodingFailure {
			t.Errorf("%s: code %d", bad.name, e.Code)
		}
	}
}
