package masq_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/masq"
)

func orphans(t *testing.T, node ns.NetNS) []string {
	t.Helper()
	var out []string
	if err := in(t, node, func() error { out = masq.Orphans(); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// The orphan sweep under nftables, in a node namespace with real nf_tables:
// a network kept by Keep (masquerade table, forward accept rules, a pod's
// macspoofchk rule) has no orphan; an empty village table, the macspoofchk
// rule of a host veth that is gone, and iptables chains nothing jumps to
// (nat and filter) are listed, each once, and nothing else.
func TestOrphansBothBackends(t *testing.T) {
	node := testenv.NewNS(t)
	addBridge(t, node, "brx")
	network := fmt.Sprintf("orphan%d", os.Getpid()) // its macspoofchk records live on the host
	s := nftSpec(t, network)
	s.ForwardAccept, s.SpoofCheck = true, true
	t.Cleanup(func() { _ = in(t, node, func() error { return masq.Teardown(network) }) })
	dockerLike(t, node) // a forward chain that drops: our accept rules go in
	mac, _ := net.ParseMAC("0a:58:0a:f4:01:05")
	err := in(t, node, func() error {
		if out, err := exec.Command("ip", "link", "add", "vethpod", "master", "brx", "type", "veth", "peer", "name", "vethpeer").CombinedOutput(); err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		for _, veth := range []string{"vethpod", "vethgone"} {
			if err := masq.EnsureSpoofCheck(masq.SpoofCheck{Network: network, HostVeth: veth, MAC: mac}); err != nil {
				return err
			}
		}
		_, err := masq.Keep(s, masq.Node{Bridge: "brx"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// What Keep made is there, and is not an orphan.
	ruleset := nft(t, node, "list", "ruleset")
	for _, want := range []string{"table inet " + masq.Table(network), "table bridge " + masq.Table(network), `"vethpod"`, `"vethgone"`, `comment "` + masq.Comment(network) + `"`} {
		if !strings.Contains(ruleset, want) {
			t.Fatalf("ruleset lacks %q:\n%s", want, ruleset)
		}
	}
	want := []string{fmt.Sprintf("macspoofchk rule of vethgone (nftables table bridge %s): the host veth is gone", masq.Table(network))}
	if got := orphans(t, node); !slices.Equal(got, want) {
		t.Fatalf("orphans of a kept network:\n got  %q\n want %q", got, want)
	}

	nft(t, node, "add", "table", "inet", "village-gone")
	ipt(t, node, "iptables", "-t", "nat", "-N", masq.Chain("gone"))
	ipt(t, node, "ip6tables", "-t", "filter", "-N", masq.ForwardChain("gone"))
	want = append([]string{
		fmt.Sprintf("masquerade chain %s (iptables nat): no POSTROUTING rule jumps to it", masq.Chain("gone")),
		fmt.Sprintf("forward accept chain %s (ip6tables filter): no FORWARD rule jumps to it", masq.ForwardChain("gone")),
	}, want...)
	want = append(want, "masquerade table inet village-gone (nftables): holds no rule")
	got := orphans(t, node)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("orphans:\n got  %q\n want %q", got, want)
	}
}
