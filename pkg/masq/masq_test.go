package masq_test

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
)

// Every call that runs iptables goes through in(): iptables rules belong to
// a network namespace, and the test's node namespace is the only one these
// tests change.
func in(t *testing.T, n ns.NetNS, f func() error) error {
	t.Helper()
	return testenv.InNS(n, f)
}

func nets(t *testing.T, cidrs ...string) []*net.IPNet {
	t.Helper()
	var out []*net.IPNet
	for _, c := range cidrs {
		_, n, err := net.ParseCIDR(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// spec is a dual-stack network on the iptables backend (nft_test.go covers
// the nftables one).
func spec(t *testing.T, network string) masq.Spec {
	return masq.Spec{
		Network:    network,
		PodSubnets: nets(t, "10.244.1.0/24", "fd00:1::/64"),
		Cluster:    nets(t, "10.244.0.0/16"),
		Backend:    masq.IPTables,
	}
}

// ipt runs an ip(6)tables command inside n.
func ipt(t *testing.T, n ns.NetNS, cmd string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(n.Path()), cmd}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s in %s: %v: %s", cmd, strings.Join(args, " "), n.Path(), err, out)
	}
	return string(out)
}

// nat returns `-S` of the nat table in n, one rule per entry, quotes
// removed, policy lines dropped.
func nat(t *testing.T, n ns.NetNS, cmd string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(ipt(t, n, cmd, "-t", "nat", "-S")), "\n") {
		if l == "" || strings.HasPrefix(l, "-P ") {
			continue
		}
		out = append(out, strings.ReplaceAll(l, `"`, ""))
	}
	return out
}

func ours(rules []string, network string) []string {
	var out []string
	for _, r := range rules {
		if strings.Contains(r, masq.Chain(network)) || strings.Contains(r, masq.Comment(network)) {
			out = append(out, r)
		}
	}
	return out
}

func want4(network string) []string {
	c, m := masq.Chain(network), masq.Comment(network)
	return []string{
		"-N " + c,
		"-A POSTROUTING -s 10.244.1.0/24 -m comment --comment " + m + " -j " + c,
		"-A " + c + " -d 10.244.0.0/16 -m comment --comment " + m + " -j RETURN",
		"-A " + c + " -d 224.0.0.0/4 -m comment --comment " + m + " -j RETURN",
		"-A " + c + " -m comment --comment " + m + " -j MASQUERADE",
	}
}

func want6(network string) []string {
	c, m := masq.Chain(network), masq.Comment(network)
	return []string{
		"-N " + c,
		"-A POSTROUTING -s fd00:1::/64 -m comment --comment " + m + " -j " + c,
		"-A " + c + " -d fd00:1::/64 -m comment --comment " + m + " -j RETURN",
		"-A " + c + " -m comment --comment " + m + " -j MASQUERADE",
	}
}

func assertRules(t *testing.T, node ns.NetNS, network string) {
	t.Helper()
	for _, f := range []struct {
		cmd  string
		want []string
	}{{"iptables", want4(network)}, {"ip6tables", want6(network)}} {
		got := ours(nat(t, node, f.cmd), network)
		if !slices.Equal(got, f.want) {
			t.Errorf("%s nat rules of %q:\n got  %q\n want %q", f.cmd, network, got, f.want)
		}
	}
}

func ensure(t *testing.T, node ns.NetNS, s masq.Spec) {
	t.Helper()
	if err := in(t, node, func() error { return masq.Ensure(s) }); err != nil {
		t.Fatal(err)
	}
}

func check(t *testing.T, node ns.NetNS, s masq.Spec) error {
	t.Helper()
	var err error
	if e := in(t, node, func() error { err = masq.Check(s, masq.Node{}); return nil }); e != nil {
		t.Fatal(e)
	}
	return err
}

func TestEnsureInstallsBothFamilies(t *testing.T) {
	node := testenv.NewNS(t)
	s := spec(t, "net1")
	ensure(t, node, s)
	assertRules(t, node, "net1")
	if err := check(t, node, s); err != nil {
		t.Errorf("Check right after Ensure: %v", err)
	}
}

func TestEnsureSingleFamily(t *testing.T) {
	node := testenv.NewNS(t)
	s := masq.Spec{Network: "v6only", PodSubnets: nets(t, "fd00:7::/64"), Cluster: nets(t, "fd00::/48", "10.0.0.0/8"), Backend: masq.IPTables}
	ensure(t, node, s)
	if got := ours(nat(t, node, "iptables"), "v6only"); len(got) != 0 {
		t.Errorf("IPv6-only network got IPv4 rules: %q", got)
	}
	got := ours(nat(t, node, "ip6tables"), "v6only")
	c := masq.Chain("v6only")
	if len(got) != 4 || !strings.Contains(got[2], "-A "+c+" -d fd00::/48 ") {
		t.Errorf("IPv6 rules do not skip the cluster network: %q", got)
	}
	if err := check(t, node, s); err != nil {
		t.Error(err)
	}
}

func TestEnsureTwiceNoDuplicates(t *testing.T) {
	node := testenv.NewNS(t)
	s := spec(t, "net1")
	ensure(t, node, s)
	ensure(t, node, s)
	assertRules(t, node, "net1")
}

func TestEnsureReplacesChangedChain(t *testing.T) {
	node := testenv.NewNS(t)
	s := spec(t, "net1")
	s.Cluster = nets(t, "10.0.0.0/8")
	ensure(t, node, s)
	// The cluster network changes: the chain follows, nothing piles up.
	ensure(t, node, spec(t, "net1"))
	assertRules(t, node, "net1")
	if err := check(t, node, s); err == nil || !strings.Contains(err.Error(), masq.Chain("net1")) {
		t.Errorf("Check of the old spec: %v, want an error naming the chain", err)
	}
}

func TestEnsureParallel(t *testing.T) {
	node := testenv.NewNS(t)
	s := spec(t, "net1")
	const n = 8
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// InNS locks this goroutine's thread and switches it into node.
			errs[i] = testenv.InNS(node, func() error { return masq.Ensure(s) })
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Ensure #%d: %v", i, err)
		}
	}
	assertRules(t, node, "net1")
}

func TestCheckNamesDrift(t *testing.T) {
	node := testenv.NewNS(t)
	s := spec(t, "net1")
	chain := masq.Chain("net1")
	ensure(t, node, s)
	if err := check(t, node, s); err != nil {
		t.Fatalf("Check after Ensure: %v", err)
	}

	ipt(t, node, "iptables", "-t", "nat", "-F", "POSTROUTING")
	err := check(t, node, s)
	if err == nil {
		t.Fatal("Check passed with the IPv4 jump rule gone")
	}
	for _, w := range []string{"iptables nat POSTROUTING", "-s 10.244.1.0/24", chain} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check error %q does not mention %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "fd00:1::/64") {
		t.Errorf("Check blames the intact IPv6 rule set: %v", err)
	}

	// Ensure repairs; then empty the chain itself.
	ensure(t, node, s)
	if err := check(t, node, s); err != nil {
		t.Fatalf("Check after repair: %v", err)
	}
	ipt(t, node, "ip6tables", "-t", "nat", "-F", chain)
	err = check(t, node, s)
	if err == nil || !strings.Contains(err.Error(), chain) || !strings.Contains(err.Error(), "ip6tables") {
		t.Errorf("Check with the IPv6 chain flushed: %v, want an error naming %s and ip6tables", err, chain)
	}

	// Chain deleted altogether.
	ensure(t, node, s)
	ipt(t, node, "iptables", "-t", "nat", "-F", "POSTROUTING")
	ipt(t, node, "iptables", "-t", "nat", "-F", chain)
	ipt(t, node, "iptables", "-t", "nat", "-X", chain)
	err = check(t, node, s)
	if err == nil || !strings.Contains(err.Error(), chain) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Check with the IPv4 chain deleted: %v, want an error naming the missing %s", err, chain)
	}
	// Everything wiped in both families (a firewall reload): both named,
	// the IPv4 failure does not hide the IPv6 one.
	ensure(t, node, s)
	for _, cmd := range []string{"iptables", "ip6tables"} {
		ipt(t, node, cmd, "-t", "nat", "-F")
		ipt(t, node, cmd, "-t", "nat", "-X")
	}
	err = check(t, node, s)
	for _, w := range []string{"iptables nat", "ip6tables nat", chain} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Check with the nat tables wiped: %v, want it to mention %q", err, w)
		}
	}
	ensure(t, node, s)
	assertRules(t, node, "net1")
}

func TestTeardownKeepsForeignRules(t *testing.T) {
	node := testenv.NewNS(t)
	foreign4 := []string{"-A POSTROUTING -s 10.9.0.0/24 -j MASQUERADE", "-A POSTROUTING -s 10.244.1.0/24 -m comment --comment village:other -j MASQUERADE"}
	foreign6 := []string{"-A POSTROUTING -s fd00:9::/64 -j MASQUERADE"}
	for _, r := range foreign4 {
		ipt(t, node, "iptables", append([]string{"-t", "nat"}, strings.Fields(r)...)...)
	}
	for _, r := range foreign6 {
		ipt(t, node, "ip6tables", append([]string{"-t", "nat"}, strings.Fields(r)...)...)
	}
	ipt(t, node, "iptables", "-t", "nat", "-N", "KUBE-POSTROUTING")

	s := spec(t, "net1")
	ensure(t, node, s)
	if err := in(t, node, func() error { return masq.Teardown("net1") }); err != nil {
		t.Fatal(err)
	}
	got4, got6 := nat(t, node, "iptables"), nat(t, node, "ip6tables")
	if o := append(ours(got4, "net1"), ours(got6, "net1")...); len(o) != 0 {
		t.Errorf("Teardown left rules of net1: %q", o)
	}
	want4 := append([]string{"-N KUBE-POSTROUTING"}, foreign4...)
	if !slices.Equal(got4, want4) {
		t.Errorf("iptables nat after Teardown:\n got  %q\n want %q", got4, want4)
	}
	if !slices.Equal(got6, foreign6) {
		t.Errorf("ip6tables nat after Teardown:\n got  %q\n want %q", got6, foreign6)
	}
	// Again, and for a network that never had rules: nothing to do.
	for _, n := range []string{"net1", "never"} {
		if err := in(t, node, func() error { return masq.Teardown(n) }); err != nil {
			t.Errorf("Teardown(%q) with nothing installed: %v", n, err)
		}
	}
	if got := nat(t, node, "iptables"); !slices.Equal(got, want4) {
		t.Errorf("repeated Teardown changed foreign rules: %q", got)
	}
}

func TestTwoNetworks(t *testing.T) {
	node := testenv.NewNS(t)
	a, b := spec(t, "net-a"), spec(t, "net-b")
	b.PodSubnets = nets(t, "10.245.1.0/24")
	b.Cluster = nets(t, "10.245.0.0/16")
	ensure(t, node, a)
	ensure(t, node, b)
	if masq.Chain("net-a") == masq.Chain("net-b") {
		t.Fatal("two networks share a chain name")
	}
	assertRules(t, node, "net-a")
	if got := ours(nat(t, node, "iptables"), "net-b"); len(got) != 5 || !strings.Contains(got[1], "-s 10.245.1.0/24") {
		t.Errorf("net-b IPv4 rules: %q", got)
	}
	if got := ours(nat(t, node, "ip6tables"), "net-b"); len(got) != 0 {
		t.Errorf("IPv4-only net-b got IPv6 rules: %q", got)
	}
	for _, s := range []masq.Spec{a, b} {
		if err := check(t, node, s); err != nil {
			t.Errorf("Check(%s): %v", s.Network, err)
		}
	}
	if err := in(t, node, func() error { return masq.Teardown("net-a") }); err != nil {
		t.Fatal(err)
	}
	if err := check(t, node, b); err != nil {
		t.Errorf("Teardown of net-a broke net-b: %v", err)
	}
	if got := ours(nat(t, node, "iptables"), "net-a"); len(got) != 0 {
		t.Errorf("net-a left behind: %q", got)
	}
}

func TestChainAndComment(t *testing.T) {
	seen := map[string]string{}
	for _, n := range []string{"net1", "net2", "k8s-pod-network", "a", strings.Repeat("n", 500), "x.y_z-1"} {
		c := masq.Chain(n)
		if c != masq.Chain(n) {
			t.Errorf("Chain(%q) not deterministic", n)
		}
		if len(c) > 28 || !strings.HasPrefix(c, "VLG-MASQ-") || strings.ContainsAny(c, " \t\"'!") {
			t.Errorf("Chain(%q) = %q: not a usable iptables chain name (≤ 28 chars)", n, c)
		}
		if prev, dup := seen[c]; dup {
			t.Errorf("Chain(%q) == Chain(%q) = %s", n, prev, c)
		}
		seen[c] = n
		if m := masq.Comment(n); len(m) > 255 || !strings.HasPrefix(m, "village:") {
			t.Errorf("Comment(%q) = %q: iptables comments hold at most 255 bytes", n, m)
		}
	}
}

func TestStamp(t *testing.T) {
	a, b := spec(t, "net1"), spec(t, "net1")
	if a.Stamp() != b.Stamp() {
		t.Error("equal specs have different stamps")
	}
	for i, other := range []masq.Spec{
		spec(t, "net2"),
		{Network: "net1", PodSubnets: nets(t, "10.244.2.0/24", "fd00:1::/64"), Cluster: nets(t, "10.244.0.0/16"), Backend: masq.IPTables},
		{Network: "net1", PodSubnets: nets(t, "10.244.1.0/24", "fd00:1::/64"), Backend: masq.IPTables},
		{Network: "net1", PodSubnets: nets(t, "10.244.1.0/24", "fd00:1::/64"), Cluster: nets(t, "10.244.0.0/16"), Backend: masq.NFTables},
		{Network: "net1", PodSubnets: nets(t, "10.244.1.0/24", "fd00:1::/64"), Cluster: nets(t, "10.244.0.0/16"), Backend: masq.IPTables, ForwardAccept: true},
	} {
		if other.Stamp() == a.Stamp() {
			t.Errorf("spec %d has the same stamp as a different spec", i)
		}
	}
	if s := a.Stamp(); s == "" || len(s) > 32 {
		t.Errorf("Stamp = %q", s)
	}
}

func TestStampItems(t *testing.T) {
	// Items are "m" + 4 hex digits of the network + the spec digest, then
	// "@" + the backend letter + the netfilter fingerprint.
	for _, c := range []struct {
		alias, key, found, stamp, next string
	}{
		{"", "mabcd", "", "mabcd1@ng1", "village:mabcd1@ng1"},
		{"someone else's alias", "mabcd", "", "mabcd1@ng1", "village:mabcd1@ng1"},
		{"village:mabcd1@ng1", "mabcd", "mabcd1@ng1", "mabcd1@ng2", "village:mabcd1@ng2"},
		{"village:m00001@ig1,mabcd1@ng1", "mabcd", "mabcd1@ng1", "mabcd2@ng1", "village:mabcd2@ng1,m00001@ig1"},
		{"village:m00001@ig1", "mabcd", "", "mabcd1@ng1", "village:mabcd1@ng1,m00001@ig1"},
		{"village:" + strings.Repeat("x", 240), "mabcd", "", "mabcd1@ng1", "village:mabcd1@ng1"},
	} {
		if got := masq.FindStamp(c.alias, c.key); got != c.found {
			t.Errorf("FindStamp(%q, %q) = %q, want %q", c.alias, c.key, got, c.found)
		}
		if got := masq.SetStamp(c.alias, c.stamp); got != c.next {
			t.Errorf("SetStamp(%q, %q) = %q, want %q", c.alias, c.stamp, got, c.next)
		}
	}
	for stamp, want := range map[string]string{"mabcd1@ng1": masq.NFTables, "mabcd1@ig1l-": masq.IPTables, "mabcd1": "", "mabcd1@": "", "mabcd1@xg1": ""} {
		if got := masq.StampBackend(stamp); got != want {
			t.Errorf("StampBackend(%q) = %q, want %q", stamp, got, want)
		}
	}
}

// addBridge makes bridge name in node.
func addBridge(t *testing.T, node ns.NetNS, name string) {
	t.Helper()
	if err := in(t, node, func() error {
		if out, err := exec.Command("ip", "link", "add", name, "type", "bridge").CombinedOutput(); err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// villaged follows the backend the plugin resolved (read from the bridge's
// stamp), not its own guess: in a container its iptables may not be the
// node's. The plugin's stamp here says iptables for the automatic spec;
// Keep as villaged puts the rules there, and Check as villaged finds them.
func TestAgentFollowsThePluginsBackend(t *testing.T) {
	node := testenv.NewNS(t)
	addBridge(t, node, "brx")
	s := spec(t, "net1")
	s.Backend = ""
	agent := masq.Node{Bridge: "brx", Agent: true}
	err := in(t, node, func() error {
		stamp := s.Stamp() + "@i-"
		if out, err := exec.Command("ip", "link", "set", "brx", "alias", masq.SetStamp("", stamp)).CombinedOutput(); err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		res, err := masq.Keep(s, agent)
		if err != nil {
			return err
		}
		if !res.Looked || res.Repaired == "" || masq.StampBackend(res.Stamp) != masq.IPTables {
			return fmt.Errorf("villaged's Keep with the plugin's iptables stamp (and no rules): %+v", res)
		}
		return masq.Check(s, agent)
	})
	if err != nil {
		t.Fatal(err)
	}
	assertRules(t, node, "net1")
	if tables := nft(t, node, "list", "tables"); strings.Contains(tables, masq.Table("net1")) {
		t.Fatalf("villaged put rules in nftables too:\n%s", tables)
	}
}
