// Package masq keeps the source NAT that lets pods reach the world: ONE rule
// set per network and IP family, shared by every pod of that network on the
// node, instead of the reference plugins' chain per container.
//
// Layout (nat table, iptables and ip6tables alike):
//
//	POSTROUTING  -s <pod subnet> -m comment --comment "village:<net>" -j VLG-MASQ-<hash>
//	VLG-MASQ-<hash>  -d <clusterCIDR or pod subnet> -j RETURN
//	VLG-MASQ-<hash>  -d 224.0.0.0/4 -j RETURN            (IPv4 only)
//	VLG-MASQ-<hash>  -j MASQUERADE
//
// Ensure is idempotent and serialised across plugin processes by a lock file;
// callers avoid even calling it on the hot path by remembering (see
// package village) that the rule set is in place. Check reports drift with a
// message that names the missing rule; Teardown removes exactly what Ensure
// added, found by the owner comment.
package masq

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

const (
	table       = "nat"
	postrouting = "POSTROUTING"
	// LockFile serialises the slow path across concurrent plugin processes.
	LockFile = "/run/village/masq.lock"
)

// Spec is the masquerade wanted for one network.
type Spec struct {
	Network string
	// PodSubnets are the node's pod subnets of this network (any family).
	PodSubnets []*net.IPNet
	// Cluster is the whole pod network per family; a family without one
	// falls back to its pod subnet.
	Cluster []*net.IPNet
}

// Chain returns the per-network chain name (iptables allows 28 characters).
func Chain(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "VLG-MASQ-" + strings.ToUpper(hex.EncodeToString(sum[:8]))
}

// Comment is the owner tag on every rule of the network.
func Comment(network string) string {
	c := "village:" + network
	if len(c) > 200 {
		c = c[:200]
	}
	return c
}

// Stamp is a short digest of the spec; callers store it to skip Ensure when
// the same rule set was already installed.
func (s Spec) Stamp() string {
	h := sha256.New()
	h.Write([]byte(s.Network))
	for _, n := range append(slices.Clone(s.PodSubnets), s.Cluster...) {
		h.Write([]byte("|" + n.String()))
	}
	return "m" + hex.EncodeToString(h.Sum(nil)[:6])
}

type familyRules struct {
	proto iptables.Protocol
	jumps [][]string // POSTROUTING rules
	chain [][]string // rules of the network chain, in order
}

func (s Spec) rules() []familyRules {
	var out []familyRules
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		fr := familyRules{proto: proto}
		chain, comment := Chain(s.Network), Comment(s.Network)
		var subnets []*net.IPNet
		for _, sn := range s.PodSubnets {
			if protoOf(sn.IP) == proto {
				subnets = append(subnets, sn)
			}
		}
		if len(subnets) == 0 {
			continue
		}
		for _, sn := range subnets {
			fr.jumps = append(fr.jumps, []string{"-s", sn.String(), "-m", "comment", "--comment", comment, "-j", chain})
		}
		keep := subnets
		if c := clusterFor(s.Cluster, proto); c != nil {
			keep = []*net.IPNet{c}
		}
		for _, k := range keep {
			fr.chain = append(fr.chain, []string{"-d", k.String(), "-m", "comment", "--comment", comment, "-j", "RETURN"})
		}
		if proto == iptables.ProtocolIPv4 {
			fr.chain = append(fr.chain, []string{"-d", "224.0.0.0/4", "-m", "comment", "--comment", comment, "-j", "RETURN"})
		}
		fr.chain = append(fr.chain, []string{"-m", "comment", "--comment", comment, "-j", "MASQUERADE"})
		out = append(out, fr)
	}
	return out
}

func clusterFor(cluster []*net.IPNet, proto iptables.Protocol) *net.IPNet {
	for _, c := range cluster {
		if protoOf(c.IP) == proto {
			return c
		}
	}
	return nil
}

func protoOf(ip net.IP) iptables.Protocol {
	if ip.To4() != nil {
		return iptables.ProtocolIPv4
	}
	return iptables.ProtocolIPv6
}

// Ensure installs the rule set, replacing the network chain's content when
// it differs and adding jump rules that are missing.
func Ensure(s Spec) error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	chain := Chain(s.Network)
	for _, fr := range s.rules() {
		ipt, err := iptables.New(iptables.IPFamily(fr.proto), iptables.Timeout(30))
		if err != nil {
			return fmt.Errorf("failed to start %s for masquerade of network %q: %w", cmdName(fr.proto), s.Network, err)
		}
		if err := ensureChain(ipt, chain, fr.chain); err != nil {
			return fmt.Errorf("failed to set up masquerade chain %s for network %q (%s): %w", chain, s.Network, cmdName(fr.proto), err)
		}
		for _, j := range fr.jumps {
			if err := ipt.AppendUnique(table, postrouting, j...); err != nil {
				return fmt.Errorf("failed to add %s rule %q for network %q: %w", cmdName(fr.proto), strings.Join(j, " "), s.Network, err)
			}
		}
	}
	return nil
}

func ensureChain(ipt *iptables.IPTables, chain string, want [][]string) error {
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
		if w[0] == "-d" && !strings.Contains(rules[i], "-d "+w[1]) {
			return false
		}
	}
	return true
}

// Check reports every missing piece of the rule set, naming it.
func Check(s Spec) error {
	chain := Chain(s.Network)
	var errs []error
	for _, fr := range s.rules() {
		ipt, err := iptables.New(iptables.IPFamily(fr.proto), iptables.Timeout(30))
		if err != nil {
			return fmt.Errorf("failed to start %s: %w", cmdName(fr.proto), err)
		}
		// The chain first: `iptables -C ... -j <chain>` fails outright (not
		// "no such rule") when the chain is gone, e.g. after `iptables -t nat
		// -F; iptables -t nat -X`.
		exists, err := ipt.ChainExists(table, chain)
		if err != nil {
			return fmt.Errorf("failed to read %s chain %s: %w", cmdName(fr.proto), chain, err)
		}
		if !exists {
			errs = append(errs, fmt.Errorf("masquerade chain %s of network %q missing from %s nat table", chain, s.Network, cmdName(fr.proto)))
			continue
		}
		for _, j := range fr.jumps {
			ok, err := ipt.Exists(table, postrouting, j...)
			if err != nil {
				return fmt.Errorf("failed to read %s nat POSTROUTING: %w", cmdName(fr.proto), err)
			}
			if !ok {
				errs = append(errs, fmt.Errorf("masquerade rule missing from %s nat POSTROUTING: %s", cmdName(fr.proto), strings.Join(j, " ")))
			}
		}
		have, err := ipt.List(table, chain)
		if err != nil {
			return fmt.Errorf("failed to list %s chain %s: %w", cmdName(fr.proto), chain, err)
		}
		if !sameRules(have, chain, fr.chain) {
			errs = append(errs, fmt.Errorf("masquerade chain %s of network %q (%s) does not hold the expected rules: have %q", chain, s.Network, cmdName(fr.proto), have))
		}
	}
	return joinLine(errs)
}

// joinLine joins errors on one line (CNI messages end up in single-line
// runtime logs and events).
func joinLine(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// Teardown removes the network's jump rules (found by owner comment, in
// both families) and its chain. Absent rules are fine.
func Teardown(network string) error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	chain := Chain(network)
	var errs []error
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(30))
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to start %s: %w", cmdName(proto), err))
			continue
		}
		rules, err := ipt.List(table, postrouting)
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to list %s nat POSTROUTING: %w", cmdName(proto), err))
			continue
		}
		for _, r := range rules {
			if !strings.HasSuffix(r, "-j "+chain) {
				continue
			}
			spec := strings.Fields(strings.TrimPrefix(r, "-A "+postrouting+" "))
			spec = unquote(spec)
			if err := ipt.DeleteIfExists(table, postrouting, spec...); err != nil {
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

// lock takes an exclusive flock on LockFile, waiting at most 30 s.
func lock() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(LockFile), 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", filepath.Dir(LockFile), err)
	}
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open lock %s: %w", LockFile, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("failed to lock %s: %w", LockFile, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
