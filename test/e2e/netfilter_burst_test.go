package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/nftables"

	"github.com/village-cni/village/internal/testenv"
)

// rulesetChurn commits nf_tables transactions (a table added and deleted)
// in node every few milliseconds until the returned stop is called, as
// kube-proxy's resyncs and the agent's policy writes do on a real node; stop
// returns how many it committed.
func rulesetChurn(t *testing.T, node *Node) (stop func() int) {
	t.Helper()
	f, err := os.Open(node.NS.Path())
	must(t, err, "open the node namespace")
	t.Cleanup(func() { f.Close() })
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	must(t, err, "nftables in the node")
	tb := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "churn"}
	commit := func() error { c.AddTable(tb); c.DelTable(tb); return c.Flush() }
	must(t, commit(), "first churn transaction")
	done, count := make(chan struct{}), make(chan int)
	go func() {
		n := 1
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				count <- n
				return
			case <-tick.C:
				if commit() == nil {
					n++
				}
			}
		}
	}()
	var once sync.Once
	stop = func() int {
		n := 0
		once.Do(func() { close(done); n = <-count })
		return n
	}
	t.Cleanup(func() { stop() })
	return stop
}

// attached is a pod with what its ADD reported: host veth, pod MAC, IPv4.
type attached struct {
	pod            *Pod
	veth, mac, ip4 string
}

// TestConcurrentAddsKeepNetfilterUnderChurn: many ADDs at once on one node
// whose ruleset others keep changing (masq.Keep's waiters skip the looks
// another ADD made for them, and each pod's macspoofchk write moves the
// stamps past itself): every ADD succeeds, every pod leaves the node
// masqueraded, a spoofed MAC is dropped, CHECK passes for every pod, and the
// macspoofchk chain holds exactly one rule per pod with its MAC. Then the
// ruleset is flushed and a second burst runs: its looks put back the rules
// of the first burst's pods too. DEL of them all, at once, leaves no rule.
func TestConcurrentAddsKeepNetfilterUnderChurn(t *testing.T) {
	const burst = 16
	for _, c := range []struct{ name, extra string }{
		{"auto", ``},
		{"iptables", `"ipMasqBackend":"iptables",`},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := NewNode(t)
			ext := outside(t, n.NS)
			l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"burst","plugins":[{"type":"village","bridge":"b-burst",
				"isGateway":true,"ipMasq":true,"macspoofchk":true,%s
				"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.85.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}`,
				c.extra, filepath.Join(n.Dir, "burst")))
			addBurst := func(what string) []attached {
				stop := rulesetChurn(t, n)
				out := make([]attached, burst)
				errs := make([]error, burst)
				var wg sync.WaitGroup
				for i := range out {
					out[i].pod = n.NewPod()
					wg.Add(1)
					go func() {
						defer wg.Done()
						res, err := n.Add(l, out[i].pod)
						if errs[i] = err; err != nil {
							return
						}
						cur, err := current.NewResultFromResult(res)
						if errs[i] = err; err != nil {
							return
						}
						out[i].veth, out[i].mac, out[i].ip4 = cur.Interfaces[1].Name, cur.Interfaces[2].Mac, cur.IPs[0].Address.IP.String()
					}()
				}
				wg.Wait()
				churned := stop()
				for i, err := range errs {
					must(t, err, "%s: concurrent ADD %d", what, i)
				}
				t.Logf("%s: %d ADDs at once, %d nf_tables transactions of others meanwhile", what, burst, churned)
				return out
			}
			verify := func(what string, pods []attached) {
				for _, p := range pods {
					must(t, testenv.Ping(p.pod.NS, "203.0.113.2", 1), "%s: egress of pod %s (%s): answered only when masqueraded", what, p.pod.ID, p.ip4)
					must(t, n.Check(l, p.pod), "%s: CHECK of pod %s", what, p.pod.ID)
				}
				must(t, egressSeenAs(t, pods[0].pod.NS, ext, "203.0.113.1"), "%s: egress leaves with the node's address", what)
				if err, seen := spoofedPing(t, pods[0].pod, pods[1].pod, pods[1].ip4); err == nil || seen != "" {
					t.Fatalf("%s: a spoofed MAC got through: ping %v; the other pod saw:\n%s", what, err, seen)
				}
				want := map[string]string{}
				for _, p := range pods {
					want[p.veth] = p.mac
				}
				if got := spoofRules(t, n); !maps.Equal(got, want) {
					t.Fatalf("%s: macspoofchk rules (host veth -> MAC):\n got  %v\n want %v", what, got, want)
				}
			}

			first := addBurst("first burst")
			verify("first burst", first)
			inNS(t, n.NS, "nft", "flush", "ruleset")
			if got := spoofRules(t, n); len(got) != 0 {
				t.Fatalf("macspoofchk rules after nft flush ruleset: %v", got)
			}
			all := append(first, addBurst("burst after a flush")...)
			verify("both bursts, after the flush", all)

			errs := make([]error, len(all))
			var wg sync.WaitGroup
			for i, p := range all {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = n.Del(l, p.pod) }()
			}
			wg.Wait()
			for i, err := range errs {
				must(t, err, "concurrent DEL %d", i)
			}
			if got := spoofRules(t, n); len(got) != 0 {
				t.Fatalf("macspoofchk rules after DEL of all %d pods: %v", len(all), got)
			}
		})
	}
}

var spoofRuleRE = regexp.MustCompile(`iifname "([^"]+)" ether saddr != ([0-9a-f:]+) .*drop comment "village:burst ([^"]+)"`)

// spoofRules reads the node's macspoofchk chain of network "burst": host
// veth -> MAC, failing on a rule whose tag names another veth or on a veth
// with two rules.
func spoofRules(t *testing.T, n *Node) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range spoofRuleRE.FindAllStringSubmatch(inNS(t, n.NS, "nft", "list", "ruleset"), -1) {
		if m[1] != m[3] {
			t.Fatalf("macspoofchk rule for %s tagged %s", m[1], m[3])
		}
		if _, dup := out[m[1]]; dup {
			t.Fatalf("two macspoofchk rules for %s", m[1])
		}
		out[m[1]] = m[2]
	}
	return out
}
