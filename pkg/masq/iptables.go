package masq

import (
	"errors"
	"fmt"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
)

// The iptables backend. Layout (iptables and ip6tables alike):
//
//	nat    POSTROUTING -s <pod subnet> -m comment --comment "village:<net>" -j VLG-MASQ-<hash>
//	nat    VLG-MASQ-<hash>  -d <clusterCIDR or pod subnet> -j RETURN
//	nat    VLG-MASQ-<hash>  -d 224.0.0.0/4 -j RETURN            (IPv4 only)
//	nat    VLG-MASQ-<hash>  -j MASQUERADE
//	filter FORWARD (first) -m comment --comment "village:<net>" -j VLG-FWD-<hash>   (forwardAccept)
//	filter VLG-FWD-<hash>  -s <clusterCIDR or pod subnet> -j ACCEPT
//	filter VLG-FWD-<hash>  -d <clusterCIDR or pod subnet> -j ACCEPT
type iptBackend struct{}

const (
	natTable    = "nat"
	filterTable = "filter"
	postrouting = "POSTROUTING"
	forward     = "FORWARD"
)

// iptPart is one chain of ours and the rules of a built-in chain that jump
// to it, for one family.
type iptPart struct {
	table, hook, chain string
	jumps              [][]string // rules in hook
	rules              [][]string // rules of chain, in order
	first              bool       // jumps go first in hook (accept before a drop)
}

type iptFamily struct {
	proto iptables.Protocol
	parts []iptPart
}

func (s Spec) iptRules() []iptFamily {
	var out []iptFamily
	comment := Comment(s.Network)
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		v4 := proto == iptables.ProtocolIPv4
		subnets := s.subnets(v4)
		if len(subnets) == 0 {
			continue
		}
		keep := s.keep(v4)
		f := iptFamily{proto: proto}
		if !s.NoMasquerade {
			p := iptPart{table: natTable, hook: postrouting, chain: Chain(s.Network)}
			for _, sn := range subnets {
				p.jumps = append(p.jumps, []string{"-s", sn.String(), "-m", "comment", "--comment", comment, "-j", p.chain})
			}
			for _, k := range keep {
				p.rules = append(p.rules, []string{"-d", k.String(), "-m", "comment", "--comment", comment, "-j", "RETURN"})
			}
			if v4 {
				p.rules = append(p.rules, []string{"-d", "224.0.0.0/4", "-m", "comment", "--comment", comment, "-j", "RETURN"})
			}
			p.rules = append(p.rules, []string{"-m", "comment", "--comment", comment, "-j", "MASQUERADE"})
			f.parts = append(f.parts, p)
		}
		if s.ForwardAccept {
			p := iptPart{table: filterTable, hook: forward, chain: ForwardChain(s.Network), first: true}
			p.jumps = [][]string{{"-m", "comment", "--comment", comment, "-j", p.chain}}
			for _, k := range keep {
				p.rules = append(p.rules,
					[]string{"-s", k.String(), "-m", "comment", "--comment", comment, "-j", "ACCEPT"},
					[]string{"-d", k.String(), "-m", "comment", "--comment", comment, "-j", "ACCEPT"})
			}
			f.parts = append(f.parts, p)
		}
		out = append(out, f)
	}
	return out
}

func newIPT(proto iptables.Protocol) (*iptables.IPTables, error) {
	ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(30))
	if err != nil {
		return nil, fmt.Errorf("failed to start %s: %w", cmdName(proto), err)
	}
	return ipt, nil
}

func (iptBackend) ensure(s Spec) error {
	for _, f := range s.iptRules() {
		ipt, err := newIPT(f.proto)
		if err != nil {
			return fmt.Errorf("netfilter rules of network %q: %w", s.Network, err)
		}
		for _, p := range f.parts {
			if err := ensureChain(ipt, p.table, p.chain, p.rules); err != nil {
				return fmt.Errorf("failed to set up %s chain %s for network %q (%s): %w", p.table, p.chain, s.Network, cmdName(f.proto), err)
			}
			for _, j := range p.jumps {
				if err := ensureJump(ipt, p, j); err != nil {
					return fmt.Errorf("failed to add %s %s rule %q for network %q: %w", cmdName(f.proto), p.hook, strings.Join(j, " "), s.Network, err)
				}
			}
		}
	}
	// Parts the spec no longer wants (ipMasq or forwardAccept turned off).
	var errs []error
	if s.NoMasquerade {
		errs = append(errs, iptTeardownPart(natTable, postrouting, Chain(s.Network)))
	}
	if !s.ForwardAccept {
		errs = append(errs, iptTeardownPart(filterTable, forward, ForwardChain(s.Network)))
	}
	return errors.Join(errs...)
}

func ensureJump(ipt *iptables.IPTables, p iptPart, j []string) error {
	if !p.first {
		return ipt.AppendUnique(p.table, p.hook, j...)
	}
	ok, err := ipt.Exists(p.table, p.hook, j...)
	if err != nil || ok {
		return err
	}
	return ipt.Insert(p.table, p.hook, 1, j...)
}

func ensureChain(ipt *iptables.IPTables, table, chain string, want [][]string) error {
	exists, err := ipt.ChainExists(table, chain)
	if err != nil {
		return err
	}
	if exists {
		have, err := ipt.List(table, chain)
		if err != nil {
			return err
		}
		if sameRules(have, chain, want) {
			return nil
		}
	}
	if err := ipt.ClearChain(table, chain); err != nil { // creates it when missing
		return err
	}
	for _, r := range want {
		if err := ipt.Append(table, chain, r...); err != nil {
			return err
		}
	}
	return nil
}

// sameRules compares `iptables -S chain` output (first line is -N) with want
// by the addresses and targets they carry, which is enough to see drift.
func sameRules(have []string, chain string, want [][]string) bool {
	var rules []string
	for _, h := range have {
		if strings.HasPrefix(h, "-A "+chain+" ") {
			rules = append(rules, h)
		}
	}
	if len(rules) != len(want) {
		return false
	}
	for i, w := range want {
		if !strings.Contains(rules[i], "-j "+w[len(w)-1]) {
			return false
		}
		if (w[0] == "-d" || w[0] == "-s") && !strings.Contains(rules[i], w[0]+" "+w[1]) {
			return false
		}
	}
	return true
}

func (iptBackend) check(s Spec) error {
	var errs []error
	for _, f := range s.iptRules() {
		ipt, err := newIPT(f.proto)
		if err != nil {
			return err
		}
		for _, p := range f.parts {
			what := "masquerade"
			if p.table == filterTable {
				what = "forward accept"
			}
			// The chain first: `iptables -C ... -j <chain>` fails outright
			// (not "no such rule") when the chain is gone, e.g. after
			// `iptables -t nat -F; iptables -t nat -X`.
			exists, err := ipt.ChainExists(p.table, p.chain)
			if err != nil {
				return fmt.Errorf("failed to read %s chain %s: %w", cmdName(f.proto), p.chain, err)
			}
			if !exists {
				errs = append(errs, fmt.Errorf("%s chain %s of network %q missing from %s %s table", what, p.chain, s.Network, cmdName(f.proto), p.table))
				continue
			}
			for _, j := range p.jumps {
				ok, err := ipt.Exists(p.table, p.hook, j...)
				if err != nil {
					return fmt.Errorf("failed to read %s %s %s: %w", cmdName(f.proto), p.table, p.hook, err)
				}
				if !ok {
					errs = append(errs, fmt.Errorf("%s rule missing from %s %s %s: %s", what, cmdName(f.proto), p.table, p.hook, strings.Join(j, " ")))
				}
			}
			have, err := ipt.List(p.table, p.chain)
			if err != nil {
				return fmt.Errorf("failed to list %s chain %s: %w", cmdName(f.proto), p.chain, err)
			}
			if !sameRules(have, p.chain, p.rules) {
				errs = append(errs, fmt.Errorf("%s chain %s of network %q (%s) does not hold the expected rules: have %q", what, p.chain, s.Network, cmdName(f.proto), have))
			}
		}
	}
	errs = append(errs, unwantedChains(s)...)
	return JoinLine(errs)
}

// unwantedChains reports the chains of parts the spec no longer wants
// (ipMasq or forwardAccept turned off) that are still there, as the
// nftables backend reports a table left with ipMasq off.
func unwantedChains(s Spec) []error {
	var gone []iptPart
	if s.NoMasquerade {
		gone = append(gone, iptPart{table: natTable, chain: Chain(s.Network)})
	}
	if !s.ForwardAccept {
		gone = append(gone, iptPart{table: filterTable, chain: ForwardChain(s.Network)})
	}
	if len(gone) == 0 {
		return nil
	}
	var errs []error
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := newIPT(proto)
		if err != nil {
			continue
		}
		for _, p := range gone {
			if ok, _ := ipt.ChainExists(p.table, p.chain); ok {
				errs = append(errs, fmt.Errorf("%s %s chain %s of network %q present although the config no longer wants it", cmdName(proto), p.table, p.chain, s.Network))
			}
		}
	}
	return errs
}

func (iptBackend) teardown(network string) error {
	return errors.Join(
		iptTeardownPart(natTable, postrouting, Chain(network)),
		iptTeardownPart(filterTable, forward, ForwardChain(network)))
}

// iptTeardownPart removes the rules of hook that jump to chain (in both
// families) and the chain itself.
func iptTeardownPart(table, hook, chain string) error {
	var errs []error
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := newIPT(proto)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rules, err := ipt.List(table, hook)
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to list %s %s %s: %w", cmdName(proto), table, hook, err))
			continue
		}
		for _, r := range rules {
			if !strings.HasSuffix(r, "-j "+chain) {
				continue
			}
			spec := unquote(strings.Fields(strings.TrimPrefix(r, "-A "+hook+" ")))
			if err := ipt.DeleteIfExists(table, hook, spec...); err != nil {
				errs = append(errs, fmt.Errorf("failed to delete %s rule %q: %w", cmdName(proto), r, err))
			}
		}
		if ok, _ := ipt.ChainExists(table, chain); ok {
			if err := ipt.ClearAndDeleteChain(table, chain); err != nil {
				errs = append(errs, fmt.Errorf("failed to delete %s chain %s: %w", cmdName(proto), chain, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unquote strips the quotes iptables -S puts around comments (ours have no
// spaces, so splitting on fields kept them whole).
func unquote(spec []string) []string {
	for i, s := range spec {
		spec[i] = strings.Trim(s, "\"")
	}
	return spec
}

func cmdName(p iptables.Protocol) string {
	if p == iptables.ProtocolIPv6 {
		return "ip6tables"
	}
	return "iptables"
}

func iptPresent(network string) []string {
	var out []string
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := newIPT(proto)
		if err != nil {
			continue
		}
		for _, tc := range [][2]string{{natTable, Chain(network)}, {filterTable, ForwardChain(network)}} {
			if ok, _ := ipt.ChainExists(tc[0], tc[1]); ok {
				out = append(out, fmt.Sprintf("%s %s chain %s", cmdName(proto), tc[0], tc[1]))
			}
		}
	}
	return out
}

// iptMaybePresent tells, without exec, whether the iptables backend may
// hold rules of the network: never without an iptables binary; with
// iptables-nft only if nf_tables has a chain of ours; with legacy
// iptables whenever a legacy table exists in this namespace.
func iptMaybePresent(network string) bool {
	h := Detect()
	switch {
	case h.IPTables == "":
		return false
	case h.Legacy:
		return legacyTablesExist()
	}
	c, err := nftables.New()
	if err != nil {
		return true
	}
	chains, err := c.ListChains()
	if err != nil {
		return true
	}
	for _, ch := range chains {
		if ch.Name == Chain(network) || ch.Name == ForwardChain(network) {
			return true
		}
	}
	return false
}
