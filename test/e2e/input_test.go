package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/village"
)

// TestBadInputGivesCNIErrors runs the real binary with hostile or broken
// input: every case must print a CNI error JSON on stdout with the right
// code, exit non-zero, not panic, and write nothing outside the data dir.
func TestBadInputGivesCNIErrors(t *testing.T) {
	n := NewNode(t)
	pod := n.NewPod()
	data := filepath.Join(n.Dir, "ipam")
	good := func(ver string) []byte {
		return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"bad","type":"village","bridge":"bad0","isGateway":true,
			"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.40.0.0/24"}]]}}`, ver, data))
	}
	regular := filepath.Join(n.Dir, "not-a-netns")
	must(t, os.WriteFile(regular, []byte("x"), 0o600), "write file")
	before := files(t, n.Dir)

	cases := []struct {
		name  string
		call  testenv.Call
		code  uint
		inMsg string
	}{
		{"not JSON", testenv.Call{Stdin: []byte("{nope")}, types.ErrDecodingFailure, ""},
		{"missing name", testenv.Call{Stdin: []byte(`{"cniVersion":"1.1.0","type":"village"}`)}, types.ErrInvalidNetworkConfig, "name"},
		{"bad subnet", testenv.Call{Stdin: []byte(strings.Replace(string(good("1.1.0")), "10.40.0.0/24", "10.40.0.0/99", 1))}, types.ErrInvalidNetworkConfig, "subnet"},
		{"negative mtu", testenv.Call{Stdin: []byte(strings.Replace(string(good("1.1.0")), `"isGateway":true`, `"mtu":-1`, 1))}, types.ErrInvalidNetworkConfig, "mtu"},
		{"missing netns", testenv.Call{Netns: "/run/netns/does-not-exist-village"}, types.ErrInvalidEnvironmentVariables, "does-not-exist-village"},
		{"netns is a regular file", testenv.Call{Netns: regular}, types.ErrInvalidEnvironmentVariables, "not-a-netns"},
		{"host netns", testenv.Call{Netns: "/proc/self/ns/net"}, types.ErrInvalidNetNS, "own network namespace"},
		{"ifname with slash", testenv.Call{IfName: "eth/0"}, types.ErrInvalidEnvironmentVariables, ""},
		{"ifname too long", testenv.Call{IfName: "eth0123456789abcdef"}, types.ErrInvalidEnvironmentVariables, ""},
		{"container id traversal", testenv.Call{ContainerID: "../../etc"}, types.ErrInvalidEnvironmentVariables, ""},
		{"unsupported cniVersion", testenv.Call{Stdin: good("9.9.9")}, types.ErrIncompatibleCNIVersion, ""},
		{"ipam type is a path", testenv.Call{Stdin: []byte(strings.Replace(string(good("1.1.0")), `"type":"village-ipam"`, `"type":"../../bin/sh"`, 1))}, types.ErrInvalidNetworkConfig, "ipam.type"},
		{"ipam plugin missing", testenv.Call{Stdin: []byte(strings.Replace(string(good("1.1.0")), `"type":"village-ipam"`, `"type":"no-such-ipam"`, 1))}, types.ErrInvalidNetworkConfig, "no-such-ipam"},
		{"unknown CNI_ARGS key", testenv.Call{Args: "FOO=bar"}, types.ErrInvalidEnvironmentVariables, "FOO"},
		{"bad MAC", testenv.Call{Args: "MAC=zz:zz"}, types.ErrInvalidNetworkConfig, "MAC"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			call := c.call
			call.Bin = "village"
			call.Command = "ADD"
			if call.ContainerID == "" {
				call.ContainerID = "bad-input"
			}
			if call.Netns == "" {
				call.Netns = pod.NS.Path()
			}
			if call.IfName == "" {
				call.IfName = "eth0"
			}
			if call.Stdin == nil {
				call.Stdin = good("1.1.0")
			}
			out := n.Exec(call)
			e := CNIError(t, out)
			if e.Code != c.code {
				t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, c.code)
			}
			if c.inMsg != "" && !strings.Contains(e.Msg+e.Details, c.inMsg) {
				t.Fatalf("message %q does not name %q", e.Msg, c.inMsg)
			}
		})
	}
	// Nothing was allocated, nothing written anywhere but the data dir.
	if left := ipFiles(t, data); len(left) != 0 {
		t.Fatalf("a failed ADD left allocations: %v", left)
	}
	for _, f := range files(t, n.Dir) {
		if !slices.Contains(before, f) && !strings.HasPrefix(f, "ipam/") {
			t.Fatalf("bad input wrote %s outside the data dir", f)
		}
	}
	if out := testenv.MustIP(t, pod.NS, "-o", "link"); strings.Contains(out, "eth0") {
		t.Fatalf("a failed ADD left eth0: %s", out)
	}
	// The control: the same call with good input allocates exactly one
	// address where the check above looked (so it did not pass on a wrong path).
	ok := n.NewPod()
	if out := n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: ok.ID, Netns: ok.NS.Path(), IfName: "eth0", Stdin: good("1.1.0")}); out.ExitCode != 0 {
		t.Fatalf("control ADD with good input: %s %s", out.Stdout, out.Stderr)
	}
	if got := ipFiles(t, data); len(got) != 1 {
		t.Fatalf("control ADD: allocations %v under %s, want one", got, data)
	}
}

// TestFailedAddRollsBack makes ADD fail after IPAM (the bridge name is taken
// by a veth) and checks that the allocation is released and no link stays.
func TestFailedAddRollsBack(t *testing.T) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	testenv.MustIP(t, n.NS, "link", "add", "taken0", "type", "veth", "peer", "name", "taken1")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rb","plugins":[{"type":"village","bridge":"taken0","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.41.0.0/24"}]]}}]}`, data))
	p := n.NewPod()
	_, err := n.Add(l, p)
	if err == nil || !strings.Contains(err.Error(), "taken0") || !strings.Contains(err.Error(), "not a bridge") {
		t.Fatalf("ADD onto a non-bridge: %v, want an error naming taken0", err)
	}
	// A gateway conflict fails after IPAM and the veth: both must be undone.
	testenv.MustIP(t, n.NS, "link", "add", "conflict0", "type", "bridge")
	testenv.MustIP(t, n.NS, "addr", "add", "10.99.0.1/24", "dev", "conflict0")
	l2 := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rb2","plugins":[{"type":"village","bridge":"conflict0","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.41.0.0/24"}]]}}]}`, data))
	_, err = n.Add(l2, p)
	if err == nil || !strings.Contains(err.Error(), "10.99.0.1/24") || !strings.Contains(err.Error(), "10.41.0.1/24") {
		t.Fatalf("ADD with a gateway conflict: %v, want an error naming both addresses", err)
	}
	// IPAM ran for both networks (their directories are there), and left
	// no allocation.
	mustExist(t, filepath.Join(data, "rb"))
	mustExist(t, filepath.Join(data, "rb2"))
	if left := ipFiles(t, data); len(left) != 0 {
		t.Fatalf("failed ADD left allocations: %v", left)
	}
	if out := testenv.MustIP(t, p.NS, "-o", "link"); strings.Contains(out, "eth0") {
		t.Fatalf("failed ADD left eth0: %s", out)
	}
	if out := testenv.MustIP(t, n.NS, "-o", "link", "show", "master", "conflict0"); strings.TrimSpace(out) != "" {
		t.Fatalf("failed ADD left a port on the bridge: %s", out)
	}
	// forceAddress replaces the conflicting address.
	l3 := ConfList(t, strings.Replace(string(l2.Bytes), `"isGateway":true`, `"isGateway":true,"forceAddress":true`, 1))
	n.MustAdd(l3, p)
	if out := testenv.MustIP(t, n.NS, "-o", "addr", "show", "dev", "conflict0"); strings.Contains(out, "10.99.0.1") || !strings.Contains(out, "10.41.0.1/24") {
		t.Fatalf("forceAddress did not replace the address: %s", out)
	}
	must(t, n.Del(l3, p), "DEL")
}

// TestMasqueradeOncePerNetwork proves the lean hot path: the first ADD of a
// network installs one shared rule set; later ADDs and DELs run no
// iptables or nft command at all (spies on PATH record every call). The
// nftables backend (the automatic choice on this iptables-nft host) runs
// none even on the first ADD: it speaks netlink. After a flush CHECK names
// the missing rules (code 111) and changes nothing; the next ADD repairs.
func TestMasqueradeOncePerNetwork(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables", ""} {
		t.Run("backend="+backend, func(t *testing.T) { masqueradeOnce(t, backend) })
	}
}

func masqueradeOnce(t *testing.T, backend string) {
	n := NewNode(t)
	data := filepath.Join(n.Dir, "ipam")
	log := filepath.Join(n.Dir, "netfilter-calls")
	spies := map[string][]byte{}
	for _, tool := range []string{"iptables", "ip6tables", "nft", "iptables-nft", "iptables-legacy"} {
		real := strings.TrimSpace(sh(t, "sh", "-c", "command -v "+tool))
		spies[tool] = fmt.Appendf(nil, "#!/bin/sh\necho \"%s $*\" >> %s\nexec %s \"$@\"\n", tool, log, real)
	}
	spyDir := execDir(t, filepath.Join(n.Dir, "spy"), spies)
	be := ""
	if backend != "" {
		be = fmt.Sprintf(`"ipMasqBackend":%q,`, backend)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"masq1","type":"village","bridge":"masq1","isGateway":true,"ipMasq":true,%s
		"clusterCIDR":"10.42.0.0/16","ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.42.1.0/24"}],[{"subnet":"fd42::/64"}]]}}`, be, data)
	env := []string{"PATH=" + spyDir + ":" + os.Getenv("PATH")}
	run := func(cmd string, p *Pod) {
		t.Helper()
		out := n.Exec(testenv.Call{Bin: "village", Command: cmd, ContainerID: p.ID, Netns: p.NS.Path(), IfName: "eth0", Stdin: []byte(conf), Env: env})
		if out.ExitCode != 0 {
			t.Fatalf("%s: %s %s", cmd, out.Stdout, out.Stderr)
		}
	}
	calls := func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "\n")
	}
	pods := []*Pod{n.NewPod(), n.NewPod(), n.NewPod()}
	run("ADD", pods[0])
	first := calls()
	switch {
	case backend == "iptables" && first == 0:
		t.Fatal("first ADD with ipMasq ran no iptables: the spy is not on the plugin's PATH")
	case backend != "iptables" && first != 0:
		b, _ := os.ReadFile(log)
		t.Fatalf("the nftables backend ran %d commands:\n%s", first, b)
	}
	run("ADD", pods[1])
	run("ADD", pods[2])
	run("DEL", pods[1])
	if got := calls(); got != first {
		b, _ := os.ReadFile(log)
		t.Fatalf("later ADDs/DELs ran %d netfilter commands:\n%s", got-first, b)
	}
	if backend != "iptables" {
		rs := inNS(t, n.NS, "nft", "list", "table", "inet", "village-masq1")
		if strings.Count(rs, `comment "village:masq1"`) != 5 || !strings.Contains(rs, "ip daddr 10.42.0.0/16 return") {
			t.Fatalf("want one rule set per family (3 IPv4, 2 IPv6) skipping clusterCIDR:\n%s", rs)
		}
		if ipt := inNS(t, n.NS, "iptables-save"); strings.Contains(ipt, "VLG-") {
			t.Fatalf("nftables backend left iptables rules:\n%s", ipt)
		}
		inNS(t, n.NS, "nft", "flush", "ruleset")
	} else {
		v4 := inNS(t, n.NS, "iptables", "-t", "nat", "-S")
		v6 := inNS(t, n.NS, "ip6tables", "-t", "nat", "-S")
		if strings.Count(v4, "village:masq1") != 4 || strings.Count(v6, "village:masq1") != 3 {
			t.Fatalf("want one rule set per family:\n%s\n%s", v4, v6)
		}
		if !strings.Contains(v4, "-d 10.42.0.0/16") {
			t.Fatalf("clusterCIDR not excluded from masquerade:\n%s", v4)
		}
		inNS(t, n.NS, "iptables", "-t", "nat", "-F", "POSTROUTING")
	}
	// Flushed by hand: CHECK names what is missing and changes nothing; the
	// next ADD puts it back.
	prev := n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: pods[0].ID, Netns: pods[0].NS.Path(), IfName: "eth0", Stdin: []byte(conf)})
	// That repeated ADD repaired the rules already; flush again for CHECK.
	if backend != "iptables" {
		inNS(t, n.NS, "nft", "flush", "ruleset")
	} else {
		inNS(t, n.NS, "iptables", "-t", "nat", "-F", "POSTROUTING")
	}
	want := "POSTROUTING"
	if backend != "iptables" {
		want = "table inet village-masq1"
	}
	checkConf := strings.TrimSuffix(strings.TrimSpace(conf), "}") + `,"prevResult":` + string(prev.Stdout) + "}"
	check := func() testenv.Output {
		return n.Exec(testenv.Call{Bin: "village", Command: "CHECK", ContainerID: pods[0].ID, Netns: pods[0].NS.Path(), IfName: "eth0", Stdin: []byte(checkConf)})
	}
	before := netfilterState(t, n.NS)
	out := check()
	if e := CNIError(t, out); e.Code != village.ErrCodeNodeDrift || !strings.Contains(e.Msg, want) {
		t.Fatalf("CHECK after the flush: exit %d %s, want code %d naming %q", out.ExitCode, out.Stdout, village.ErrCodeNodeDrift, want)
	}
	if after := netfilterState(t, n.NS); after != before {
		t.Fatalf("CHECK changed the node's netfilter state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	run("ADD", n.NewPod())
	if out := check(); out.ExitCode != 0 {
		t.Fatalf("CHECK after the next ADD restored the rules: %s", out.Stdout)
	}
}
