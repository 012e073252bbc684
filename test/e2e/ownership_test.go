package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// linkIdentity is what must not change about an interface Village does not
// own: index, name, kind, MAC, alias and addresses.
func linkIdentity(t *testing.T, p *Pod, dev string) string {
	t.Helper()
	return testenv.MustIP(t, p.NS, "-o", "-d", "link", "show", "dev", dev) + testenv.MustIP(t, p.NS, "-o", "addr", "show", "dev", dev)
}

// TestDelAndRetryRespectOwnership: DEL removes only an interface Village
// made for that container, and a failed retry of ADD does not release the
// addresses a live attachment holds.
func TestDelAndRetryRespectOwnership(t *testing.T) {
	n := NewNode(t)
	testenv.MustIP(t, n.NS, "link", "add", "lan0", "type", "veth", "peer", "name", "lan0p")
	testenv.MustIP(t, n.NS, "addr", "add", "192.168.90.1/24", "dev", "lan0")
	testenv.MustIP(t, n.NS, "link", "set", "lan0", "up")
	testenv.MustIP(t, n.NS, "link", "set", "lan0p", "up")
	data := filepath.Join(n.Dir, "ipam")
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"own","plugins":[{"type":"village","bridge":"vlg-own","isGateway":true,
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.77.0.0/24"}]]},
		"backend":{"type":"vxlan","underlay":"lan0","vni":5}}]}`, data))

	t.Run("foreign eth0", func(t *testing.T) {
		p := n.NewPod()
		testenv.MustIP(t, p.NS, "link", "add", "eth0", "type", "veth", "peer", "name", "other0")
		testenv.MustIP(t, p.NS, "addr", "add", "10.1.2.3/24", "dev", "eth0")
		before := linkIdentity(t, p, "eth0")
		if !strings.Contains(before, "10.1.2.3/24") {
			t.Fatalf("the foreign eth0 is not there: %s", before)
		}
		_, err := n.Add(l, p)
		if err == nil || !strings.Contains(err.Error(), "was not made for container") {
			t.Fatalf("ADD over another container's eth0: %v, want a refusal", err)
		}
		must(t, n.Del(l, p), "the runtime's DEL after the refused ADD")
		if after, err := testenv.IP(p.NS, "-o", "-d", "link", "show", "dev", "eth0"); err != nil {
			t.Fatalf("DEL removed the foreign eth0: %v", err)
		} else if after+testenv.MustIP(t, p.NS, "-o", "addr", "show", "dev", "eth0") != before {
			t.Fatalf("DEL changed the foreign eth0:\nbefore %s\nafter  %s", before, after)
		}
		if got := ipFiles(t, data); len(got) != 0 {
			t.Fatalf("allocations left by the refused ADD: %v", got)
		}
	})

	t.Run("failed retry of a live ADD", func(t *testing.T) {
		p := n.NewPod()
		r := n.MustAdd(l, p)
		held := r.IPs[0].Address.IP.String()
		owned := func() bool {
			return slices.ContainsFunc(ipFiles(t, data), func(f string) bool { return filepath.Base(f) == held })
		}
		if !owned() {
			t.Fatalf("no allocation file for %s in %s: %v", held, data, ipFiles(t, data))
		}
		// The underlay loses its address: a retried ADD of the same pod fails
		// in the overlay step, after the IPAM plugin handed back its addresses.
		testenv.MustIP(t, n.NS, "addr", "flush", "dev", "lan0")
		if _, err := n.Add(l, p); err == nil || !strings.Contains(err.Error(), "lan0") {
			t.Fatalf("retried ADD without an underlay address: %v, want a failure naming lan0", err)
		}
		if !owned() {
			t.Fatalf("the failed retry released %s, which the live pod holds: %v", held, ipFiles(t, data))
		}
		if a := podAddrs(t, p, "eth0"); !strings.Contains(a, held) {
			t.Fatalf("the live pod lost its address: %s", a)
		}
		testenv.MustIP(t, n.NS, "addr", "add", "192.168.90.1/24", "dev", "lan0")
		q := n.NewPod()
		if got := n.MustAdd(l, q).IPs[0].Address.IP.String(); got == held {
			t.Fatalf("a new pod got %s, still held by the live pod", got)
		}
		must(t, n.Del(l, p), "DEL")
		must(t, n.Del(l, q), "DEL")
		if owned() {
			t.Fatalf("DEL left the allocation of %s", held)
		}
	})
}
