package main

import (
	"fmt"
	"math"
	"net"
	"os/exec"
	"strings"
	"time"

	"github.com/village-cni/village/pkg/masq"
)

// backends: sequential ADD/DEL with ipMasq on through each masquerade
// backend, against the reference bridge with the same ipMasqBackend.
func backends(l *lab, o options, v, r *suite, s samples, t *table) error {
	for _, b := range []string{"iptables", "nftables"} {
		network := "m" + b[:3]
		logf("sequential ipMasqBackend %s: %d pods per suite", b, o.seq)
		pods := map[*suite][]string{}
		for _, su := range []*suite{v, r} {
			p, err := l.newPods("b"+b[:1]+su.short, o.seq)
			if err != nil {
				return err
			}
			pods[su] = p
		}
		for _, verb := range []string{"add", "del"} {
			for i := 0; i < o.seq; i++ {
				for _, su := range order(i, v, r) {
					d, err := su.cnitoolRun(verb, network, pods[su][i])
					if err != nil {
						return err
					}
					s.add(su.short+"."+network+"."+verb, ms(d))
				}
			}
		}
		for _, su := range []*suite{v, r} {
			l.delAll(pods[su])
		}
		for _, verb := range []string{"ADD", "DEL"} {
			k := network + "." + map[string]string{"ADD": "add", "DEL": "del"}[verb]
			t.add(row2(fmt.Sprintf("%s, sequential, ipMasq on, ipMasqBackend %s (%d pods)", verb, b, o.seq), s.med("v."+k), s.med("r."+k), "ms"))
		}
	}
	return nil
}

// verification: what masq.Keep costs an ADD, measured in-process inside
// Village's node namespace on a bridge of its own (the stamp's home): with
// nothing changed (the fingerprint read), after an unrelated ruleset change
// (the rules read again, all there), and after a flush (read again and
// repaired).
func verification(v *suite, s samples, t *table) error {
	_, sub, _ := net.ParseCIDR("10.96.1.0/24")
	_, cluster, _ := net.ParseCIDR("10.96.0.0/16")
	_, sub6, _ := net.ParseCIDR("fd96:1::/64")
	const bridge = "vfy0"
	at := masq.Node{Bridge: bridge}
	setAlias := func(alias string) error {
		if out, err := exec.Command("ip", "link", "set", bridge, "alias", alias).CombinedOutput(); err != nil {
			return fmt.Errorf("ip link set %s alias: %v: %s", bridge, err, out)
		}
		return nil
	}
	return inNS(netnsPath(v.node), func() error {
		if out, err := exec.Command("ip", "link", "add", bridge, "type", "bridge").CombinedOutput(); err != nil {
			return fmt.Errorf("ip link add %s: %v: %s", bridge, err, out)
		}
		defer exec.Command("ip", "link", "del", bridge).Run()
		for _, b := range []string{"nftables", "iptables", ""} {
			name := b
			if name == "" {
				name = "automatic (" + masq.Resolve("") + " here)"
			}
			logf("verification cost, backend %s", name)
			spec := masq.Spec{Network: "verify" + b, PodSubnets: []*net.IPNet{sub, sub6}, Cluster: []*net.IPNet{cluster}, Backend: b, ForwardAccept: true}
			if err := setAlias(""); err != nil {
				return err
			}
			res, err := masq.Keep(spec, at)
			if err != nil {
				return err
			}
			if res, err = masq.Keep(spec, at); err != nil {
				return err
			}
			const fast = 5000
			began := time.Now()
			for range fast {
				r2, err := masq.Keep(spec, at)
				if err != nil {
					return err
				}
				if r2.Looked {
					return fmt.Errorf("verification looked again with nothing changed (%s)", name)
				}
			}
			perOp := float64(time.Since(began)) / fast / float64(time.Microsecond)
			t.add(row{metric: "per-ADD netfilter verification, nothing changed, backend " + name, village: perOp, reference: math.NaN(), unit: "µs", ratio: math.NaN()})

			look := 20
			if b != "nftables" && masq.Resolve(b) == masq.IPTables {
				look = 5
			}
			for range look {
				// The same spec and backend, a fingerprint that moved.
				if err := setAlias(masq.SetStamp("", res.Stamp[:strings.IndexByte(res.Stamp, '@')+2]+"moved")); err != nil {
					return err
				}
				d, err := timed(func() error { _, err := masq.Keep(spec, at); return err })
				if err != nil {
					return err
				}
				s.add("verify.look."+b, float64(d)/float64(time.Microsecond))
			}
			t.add(row{metric: "… after the ruleset moved (rules read again, all there), backend " + name, village: s.med("verify.look." + b), reference: math.NaN(), unit: "µs", ratio: math.NaN()})

			flush := []string{"nft", "flush", "ruleset"}
			if masq.Resolve(b) == masq.IPTables {
				flush = []string{"iptables", "-t", "nat", "-F"}
			}
			for range 5 {
				if out, err := exec.Command(flush[0], flush[1:]...).CombinedOutput(); err != nil {
					return fmt.Errorf("%v: %v: %s", flush, err, out)
				}
				var r3 masq.Result
				d, err := timed(func() error { var err error; r3, err = masq.Keep(spec, at); return err })
				if err != nil {
					return err
				}
				if r3.Repaired == "" {
					return fmt.Errorf("%v was not repaired (%s)", flush, name)
				}
				s.add("verify.repair."+b, float64(d)/float64(time.Microsecond))
			}
			t.add(row{metric: fmt.Sprintf("… after `%s` (read again and repaired), backend %s", joinArgs(flush), name), village: s.med("verify.repair." + b), reference: math.NaN(), unit: "µs", ratio: math.NaN()})
			if err := masq.Teardown(spec.Network); err != nil {
				return err
			}
		}
		return nil
	})
}

func timed(f func() error) (time.Duration, error) {
	began := time.Now()
	err := f()
	return time.Since(began), err
}

func joinArgs(a []string) string {
	out := ""
	for i, s := range a {
		if i > 0 {
			out += " "
		}
		out += s
	}
	return out
}
