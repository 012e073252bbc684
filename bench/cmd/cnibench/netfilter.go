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

// backends: the masquerade rows with the same ipMasqBackend on both sides
// (the defaults differ: Village's is automatic, the reference's iptables).
// Per backend: sequential ADD/DEL with the exec floor after each operation
// (both backends interleaved per pod, as in latency), and the burst.
func backends(l *lab, o options, v, r *suite, s samples, t *table) error {
	names := []string{"iptables", "nftables"}
	var networks []string
	for _, b := range names {
		networks = append(networks, "m"+b[:3])
	}
	if err := sequential(l, o, v, r, s, networks, "b"); err != nil {
		return err
	}
	for _, b := range names {
		if err := burstRounds(l, o, v, r, s, "b"+b[:3], "burst"+b[:3]); err != nil {
			return err
		}
	}
	for _, b := range names {
		n := "m" + b[:3]
		for _, verb := range []string{"ADD", "DEL"} {
			k := n + "." + strings.ToLower(verb)
			t.add(row2(fmt.Sprintf("%s, sequential, ipMasq on, ipMasqBackend %s on both (%d pods)", verb, b, o.seq), s.med("v."+k), s.med("r."+k), "ms"))
		}
		for _, verb := range []string{"ADD", "DEL"} {
			k := "gap." + n + "." + strings.ToLower(verb)
			t.add(row2(fmt.Sprintf("%s, ipMasq on, ipMasqBackend %s on both, above the exec floor", verb, b), s.med("v."+k), s.med("r."+k), "ms"))
		}
		k := "cpu." + n + ".add"
		t.add(row2(fmt.Sprintf("CPU time of one ADD, ipMasqBackend %s on both", b), s.med("v."+k), s.med("r."+k), "ms"))
		bk := "burst" + b[:3]
		t.add(row2(fmt.Sprintf("burst ADD wall, %d pods %d at a time, ipMasqBackend %s on both", o.burst, o.width, b), s.med("v."+bk+".add"), s.med("r."+bk+".add"), "ms"))
		t.add(row2(fmt.Sprintf("burst ADD, CPU time of all %d ADDs, ipMasqBackend %s on both", o.burst, b), s.med("v."+bk+"cpu.add"), s.med("r."+bk+"cpu.add"), "ms"))
		t.add(row2(fmt.Sprintf("burst DEL wall, %d pods %d at a time, ipMasqBackend %s on both", o.burst, o.width, b), s.med("v."+bk+".del"), s.med("r."+bk+".del"), "ms"))
	}
	t.add(row{metric: "exec floor in this section: loopback-only ADD via cnitool", village: s.med("v.lob.add"), reference: s.med("r.lob.add"), unit: "ms", ratio: math.NaN()})
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
