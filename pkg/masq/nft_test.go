package masq_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
)

// nft runs the nft CLI inside n.
func nft(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(n.Path()), "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s in %s: %v: %s", strings.Join(args, " "), n.Path(), err, out)
	}
	return string(out)
}

func nftSpec(t *testing.T, network string) masq.Spec {
	s := spec(t, network)
	s.Backend = masq.NFTables
	return s
}

// dockerLike gives n a FORWARD policy of drop the way iptables-nft does
// (`iptables -P FORWARD DROP`) plus a foreign accept rule, and a
// firewalld-like inet table whose forward chain drops.
func dockerLike(t *testing.T, n ns.NetNS) {
	ipt(t, n, "iptables", "-P", "FORWARD", "DROP")
	ipt(t, n, "iptables", "-A", "FORWARD", "-s", "10.9.0.0/16", "-j", "ACCEPT")
	nft(t, n, "add table inet fwlike")
	nft(t, n, "add chain inet fwlike fw_forward { type filter hook forward priority 10; policy drop; }")
}

func keep(t *testing.T, n ns.NetNS, s masq.Spec, at masq.Node) masq.Result {
	t.Helper()
	var res masq.Result
	if err := in(t, n, func() error {
		var err error
		res, err = masq.Keep(s, at)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestNFTEnsureCheckTeardown(t *testing.T) {
	node := testenv.NewNS(t)
	dockerLike(t, node)
	s := nftSpec(t, "net1")
	s.ForwardAccept = true
	ensure(t, node, s)
	ruleset := nft(t, node, "list ruleset")
	for _, want := range []string{
		"table inet " + masq.Table("net1"),
		"type nat hook postrouting priority srcnat",
		`ip saddr 10.244.1.0/24 ip daddr 10.244.0.0/16 return comment "village:net1"`,
		`ip saddr 10.244.1.0/24 masquerade comment "village:net1"`,
		`ip6 saddr fd00:1::/64 ip6 daddr fd00:1::/64 return comment "village:net1"`,
		`ip6 saddr fd00:1::/64 masquerade comment "village:net1"`,
	} {
		if !strings.Contains(ruleset, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, ruleset)
		}
	}
	// iptables-nft still reads its FORWARD chain: ours first, the foreign rule after.
	fwd := ipt(t, node, "iptables", "-S", "FORWARD")
	want := "-P FORWARD DROP\n-A FORWARD -s 10.244.0.0/16 -m comment --comment \"village:net1\" -j ACCEPT\n" +
		"-A FORWARD -d 10.244.0.0/16 -m comment --comment \"village:net1\" -j ACCEPT\n-A FORWARD -s 10.9.0.0/16 -j ACCEPT\n"
	if fwd != want {
		t.Errorf("iptables -S FORWARD:\n%s\nwant\n%s", fwd, want)
	}
	fw := nft(t, node, "list chain inet fwlike fw_forward")
	for _, want := range []string{`ip saddr 10.244.0.0/16 counter`, `ip6 daddr fd00:1::/64 counter`} {
		if !strings.Contains(fw, want) {
			t.Errorf("firewalld-like chain lacks %q:\n%s", want, fw)
		}
	}
	if err := check(t, node, s); err != nil {
		t.Fatalf("Check after Ensure: %v", err)
	}
	ensure(t, node, s)
	if again := nft(t, node, "list ruleset"); strings.Count(again, "village:net1") != strings.Count(ruleset, "village:net1") {
		t.Errorf("second Ensure changed the rule count:\n%s", again)
	}

	// A firewall reload: everything gone. Check names the table.
	nft(t, node, "flush ruleset")
	if err := check(t, node, s); err == nil || !strings.Contains(err.Error(), "table inet "+masq.Table("net1")+" of network \"net1\" missing") {
		t.Errorf("Check after nft flush ruleset: %v", err)
	}
	ensure(t, node, s)
	// Someone moves a rule of theirs above ours in the drop chain.
	dockerLike(t, node)
	if err := check(t, node, s); err == nil || !strings.Contains(err.Error(), "not at the top of nftables chain ip filter FORWARD") {
		t.Errorf("Check with a new FORWARD chain: %v", err)
	}
	ensure(t, node, s)
	if err := check(t, node, s); err != nil {
		t.Fatalf("Check after repair: %v", err)
	}

	if err := in(t, node, func() error { return masq.Teardown("net1") }); err != nil {
		t.Fatal(err)
	}
	after := nft(t, node, "list ruleset")
	if strings.Contains(after, "village") || !strings.Contains(after, "ip saddr 10.9.0.0/16") || !strings.Contains(after, "table inet fwlike") {
		t.Errorf("Teardown should remove Village's rules only:\n%s", after)
	}
}

func TestNFTTwoNetworksAndOptions(t *testing.T) {
	node := testenv.NewNS(t)
	dockerLike(t, node)
	a, b := nftSpec(t, "net-a"), nftSpec(t, "net-b")
	a.ForwardAccept, b.ForwardAccept = true, true
	b.PodSubnets, b.Cluster = nets(t, "10.245.1.0/24"), nets(t, "10.245.0.0/16")
	ensure(t, node, a)
	ensure(t, node, b)
	for _, s := range []masq.Spec{a, b} {
		if err := check(t, node, s); err != nil {
			t.Errorf("Check(%s): %v", s.Network, err)
		}
	}
	// forwardAccept off removes net-b's accept rules, ipMasq off its table.
	b.ForwardAccept = false
	ensure(t, node, b)
	if fwd := ipt(t, node, "iptables", "-S", "FORWARD"); strings.Contains(fwd, "village:net-b") || !strings.Contains(fwd, "village:net-a") {
		t.Errorf("forwardAccept off for net-b:\n%s", fwd)
	}
	b.NoMasquerade = true
	ensure(t, node, b)
	if r := nft(t, node, "list tables"); strings.Contains(r, masq.Table("net-b")) || !strings.Contains(r, masq.Table("net-a")) {
		t.Errorf("ipMasq off for net-b:\n%s", r)
	}
	if err := check(t, node, a); err != nil {
		t.Errorf("net-a after net-b's changes: %v", err)
	}
}

func TestSwitchingBackendsLeavesNothing(t *testing.T) {
	node := testenv.NewNS(t)
	dockerLike(t, node)
	s := spec(t, "net1")
	s.ForwardAccept = true
	ensure(t, node, s) // iptables
	if f := ipt(t, node, "iptables-save"); !strings.Contains(f, masq.ForwardChain("net1")) || !strings.Contains(f, masq.Chain("net1")) {
		t.Fatalf("iptables backend did not install its chains:\n%s", f)
	}
	s.Backend = masq.NFTables
	ensure(t, node, s)
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		if f := ipt(t, node, cmd); strings.Contains(f, "VLG-") {
			t.Errorf("%s after switching to nftables:\n%s", cmd, f)
		}
	}
	if err := check(t, node, s); err != nil {
		t.Error(err)
	}
	s.Backend = masq.IPTables
	ensure(t, node, s)
	if r := nft(t, node, "list ruleset"); strings.Contains(r, masq.Table("net1")) {
		t.Errorf("after switching back to iptables, the nftables table is left:\n%s", r)
	}
	if r := nft(t, node, "list table inet fwlike"); strings.Contains(r, "village") {
		t.Errorf("after switching back to iptables, accept rules are left in a foreign chain:\n%s", r)
	}
	if err := check(t, node, s); err != nil {
		t.Error(err)
	}
}

// Keep installs what no stamp recorded (not drift), then reads only the
// fingerprint until a flush moves it, and then repairs (drift). Without a
// bridge (villaged before the first ADD) it records nothing and looks
// each time, but installs only once.
func TestKeepLooksOnlyWhenTheRulesetMoved(t *testing.T) {
	for _, backend := range []string{masq.NFTables, masq.IPTables} {
		t.Run(backend, func(t *testing.T) {
			node := testenv.NewNS(t)
			addBridge(t, node, "brx")
			at := masq.Node{Bridge: "brx"}
			s := spec(t, "net1")
			s.Backend, s.ForwardAccept = backend, true
			r := keep(t, node, s, at)
			if !r.Looked || !r.Installed || r.Drift() != 0 || r.Stamp == "" {
				t.Fatalf("first Keep: %+v", r)
			}
			r = keep(t, node, s, at)
			if r.Looked || r.Installed || r.Drift() != 0 {
				t.Fatalf("Keep with nothing changed looked again: %+v", r)
			}
			flush := []string{"nft", "flush", "ruleset"}
			if backend == masq.IPTables {
				flush = []string{"iptables", "-t", "nat", "-F"}
			}
			if out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(node.Path())}, flush...)...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v %s", flush, err, out)
			}
			r = keep(t, node, s, at)
			if !r.Looked || r.Repaired == "" || r.Drift() != 1 || r.Installed {
				t.Fatalf("Keep after %v did not repair: %+v", flush, r)
			}
			t.Logf("repaired: %s", r.Repaired)
			if err := check(t, node, s); err != nil {
				t.Fatalf("after repair: %v", err)
			}

			other := testenv.NewNS(t)
			noBridge := masq.Node{Bridge: "brx", Agent: true}
			if r := keep(t, other, s, noBridge); !r.Installed || r.Drift() != 0 || r.Stamp != "" {
				t.Fatalf("first Keep without a bridge: %+v", r)
			}
			if r := keep(t, other, s, noBridge); !r.Looked || r.Installed || r.Drift() != 0 {
				t.Fatalf("second Keep without a bridge: %+v", r)
			}
		})
	}
}

// The legacy tables have no generation counter: the fingerprint of the
// iptables backend carries their entry counts.
func TestFingerprintSeesLegacyFlush(t *testing.T) {
	node := testenv.NewNS(t)
	fp := func() string {
		var s string
		_ = in(t, node, func() error { s = masq.Fingerprint(masq.IPTables); return nil })
		return s
	}
	ipt(t, node, "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "10.1.0.0/16", "-j", "MASQUERADE")
	before := fp()
	if before != fp() {
		t.Fatalf("fingerprint moves by itself: %s", before)
	}
	ipt(t, node, "iptables-legacy", "-t", "nat", "-F")
	if after := fp(); after == before {
		t.Fatalf("fingerprint %s did not change after iptables-legacy -t nat -F", after)
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	node := testenv.NewNS(t)
	path := os.Getenv("PATH")
	for _, c := range []struct{ target, want string }{
		{"xtables-legacy-multi", masq.IPTables},
		{"iptables-legacy", masq.IPTables},
		{"xtables-multi", masq.IPTables},
		{"xtables-nft-multi", masq.NFTables},
		{"iptables-nft", masq.NFTables},
		{"", masq.NFTables},
		{"iptables-wrapper", masq.NFTables}, // no legacy table in the namespace
	} {
		bin := filepath.Join(dir, c.target+"bin")
		os.RemoveAll(bin)
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if c.target != "" {
			if err := os.WriteFile(filepath.Join(bin, c.target), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(c.target, filepath.Join(bin, "iptables")); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv("PATH", bin)
		var got string
		_ = in(t, node, func() error { got = masq.Resolve(""); return nil })
		if got != c.want {
			t.Errorf("iptables -> %q: Resolve = %s, want %s", c.target, got, c.want)
		}
		if got := masq.Resolve(masq.IPTables); got != masq.IPTables {
			t.Errorf("a configured backend is kept: %s", got)
		}
	}
	// The wrapper in a namespace with a legacy table: legacy.
	t.Setenv("PATH", path)
	ipt(t, node, "iptables-legacy", "-P", "FORWARD", "DROP")
	t.Setenv("PATH", filepath.Join(dir, "iptables-wrapperbin"))
	var got string
	_ = in(t, node, func() error { got = masq.Resolve(""); return nil })
	if got != masq.IPTables {
		t.Errorf("wrapper with legacy tables present: Resolve = %s", got)
	}
}

// Forward chains that refuse by a last reject rule (firewalld's shape) get
// the accept rules; chains that only classify and jump (kube-proxy's
// nftables mode) are left alone, so their own rejects keep working.
func TestForwardAcceptOnlyWhereTheChainRefuses(t *testing.T) {
	node := testenv.NewNS(t)
	nft(t, node, "add table inet firewalld")
	nft(t, node, "add chain inet firewalld filter_FORWARD { type filter hook forward priority 10; policy accept; }")
	nft(t, node, "add rule inet firewalld filter_FORWARD ct state established,related accept")
	nft(t, node, "add rule inet firewalld filter_FORWARD reject with icmpx admin-prohibited")
	nft(t, node, "add table ip kube-proxy")
	nft(t, node, "add chain ip kube-proxy filter-forward { type filter hook forward priority -10; policy accept; }")
	nft(t, node, "add chain ip kube-proxy service-endpoints-check")
	nft(t, node, "add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check")
	s := nftSpec(t, "net1")
	s.ForwardAccept = true
	ensure(t, node, s)
	if fw := nft(t, node, "list chain inet firewalld filter_FORWARD"); strings.Count(fw, `comment "village:net1"`) != 4 {
		t.Errorf("firewalld-like chain (final reject) should get the 4 accept rules:\n%s", fw)
	}
	if kp := nft(t, node, "list table ip kube-proxy"); strings.Contains(kp, "village") {
		t.Errorf("kube-proxy's chain (no drop of its own) was changed:\n%s", kp)
	}
	if err := check(t, node, s); err != nil {
		t.Error(err)
	}
}
