package masq

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The nftables backend, over netlink (google/nftables), no exec:
//
//	table inet village-<net>
//	  chain postrouting  type nat hook postrouting priority srcnat; policy accept
//	    meta nfproto ipv4 ip saddr <pod subnet> ip daddr <clusterCIDR> return   comment "village:<net>"
//	    meta nfproto ipv4 ip saddr <pod subnet> ip daddr 224.0.0.0/4 return
//	    meta nfproto ipv4 ip saddr <pod subnet> masquerade
//	    (the same for IPv6, without the multicast rule)
//
// and with forwardAccept, at the top of every forward base chain of the
// ip, ip6 and inet tables on the node that refuses what it does not accept
// (policy drop, or a last rule that drops or rejects: iptables-nft's filter
// FORWARD after `iptables -P FORWARD DROP`, firewalld's filter_FORWARD, ...):
//
//	ip saddr <clusterCIDR> accept   comment "village:<net>"
//	ip daddr <clusterCIDR> accept   comment "village:<net>"
//
// nf_tables evaluates every base chain of a hook and a drop in any of them
// is final, so the accept must sit in the chain that would drop. The table
// is replaced in one transaction, so a packet never sees half a rule set.
type nftBackend struct{}

func ourTable(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: Table(network)}
}

func postroutingChain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}
}

// match builds `<family> saddr|daddr <n>` for a chain of family fam.
func match(fam nftables.TableFamily, n *net.IPNet, src bool) []expr.Any {
	ip4 := n.IP.To4()
	var out []expr.Any
	addr, off := []byte(n.IP.To16()), uint32(8)
	if !src {
		off = 24
	}
	if ip4 != nil {
		addr, off = []byte(ip4), 12
		if !src {
			off = 16
		}
	}
	if fam == nftables.TableFamilyINet {
		proto := byte(unix.NFPROTO_IPV6)
		if ip4 != nil {
			proto = unix.NFPROTO_IPV4
		}
		out = append(out, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
	}
	ones, bits := n.Mask.Size()
	if ones == 0 {
		return out
	}
	out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))})
	if ones != bits {
		mask := []byte(net.CIDRMask(ones, bits))
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))})
	}
	masked := make([]byte, len(addr))
	for i := range addr {
		masked[i] = addr[i] & n.Mask[len(n.Mask)-len(addr)+i]
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: masked})
}

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// masqRules are the expressions of the postrouting chain, in order.
func (s Spec) masqRules() [][]expr.Any {
	if s.NoMasquerade {
		return nil
	}
	inet := nftables.TableFamilyINet
	_, mcast, _ := net.ParseCIDR("224.0.0.0/4")
	var out [][]expr.Any
	for _, v4 := range []bool{true, false} {
		for _, sn := range s.subnets(v4) {
			from := match(inet, sn, true)
			for _, k := range s.keep(v4) {
				out = append(out, join(from, match(nftables.TableFamilyIPv4, k, false), verdict(expr.VerdictReturn)))
			}
			if v4 {
				out = append(out, join(from, match(nftables.TableFamilyIPv4, mcast, false), verdict(expr.VerdictReturn)))
			}
			out = append(out, join(from, []expr.Any{&expr.Masq{}}))
		}
	}
	return out
}

// acceptRules are the forward accept rules for a chain of family fam.
func (s Spec) acceptRules(fam nftables.TableFamily) [][]expr.Any {
	if !s.ForwardAccept {
		return nil
	}
	var out [][]expr.Any
	for _, v4 := range []bool{true, false} {
		if (fam == nftables.TableFamilyIPv4 && !v4) || (fam == nftables.TableFamilyIPv6 && v4) {
			continue
		}
		for _, k := range s.keep(v4) {
			for _, src := range []bool{true, false} {
				out = append(out, join(match(fam, k, src), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictAccept)))
			}
		}
	}
	return out
}

// acceptFor is what a foreign forward chain needs from us: the accept
// rules when the chain can refuse traffic, nothing otherwise.
func (s Spec) acceptFor(cr chainRules) [][]expr.Any {
	if !blocks(cr) {
		return nil
	}
	return s.acceptRules(cr.chain.Table.Family)
}

// blocks: the chain drops what it does not accept, by its policy (Docker's
// FORWARD DROP through iptables-nft) or by a final drop or reject rule
// (firewalld's filter_FORWARD ends in `reject with icmpx admin-prohibited`).
// Chains that only classify or jump (kube-proxy's filter-forward) are left
// alone: an accept at their top would skip their own rejects.
func blocks(cr chainRules) bool {
	if cr.chain.Policy != nil && *cr.chain.Policy == nftables.ChainPolicyDrop {
		return true
	}
	if len(cr.rules) == 0 {
		return false
	}
	last := cr.rules[len(cr.rules)-1]
	if len(last.Exprs) == 0 {
		return false
	}
	switch e := last.Exprs[len(last.Exprs)-1].(type) {
	case *expr.Reject:
		return true
	case *expr.Verdict:
		return e.Kind == expr.VerdictDrop
	}
	return false
}

func tag(network string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, Comment(network))
}

func ours(r *nftables.Rule, network string) bool {
	c, ok := userdata.GetString(r.UserData, userdata.TypeComment)
	return ok && c == Comment(network)
}

// forwardChains lists the forward-hook base chains of other tables.
func forwardChains(c *nftables.Conn, network string) ([]*nftables.Chain, error) {
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("failed to list nftables chains: %w", err)
	}
	var out []*nftables.Chain
	for _, ch := range chains {
		if ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookForward || ch.Type != nftables.ChainTypeFilter {
			continue
		}
		switch ch.Table.Family {
		case nftables.TableFamilyIPv4, nftables.TableFamilyIPv6, nftables.TableFamilyINet:
		default:
			continue
		}
		if ch.Table.Name == Table(network) {
			continue
		}
		out = append(out, ch)
	}
	return out, nil
}

// chainRules is a chain with its rules.
type chainRules struct {
	chain *nftables.Chain
	rules []*nftables.Rule
}

// forwardRules lists the forward base chains of other tables with their rules.
func forwardRules(c *nftables.Conn, network string) ([]chainRules, error) {
	chains, err := forwardChains(c, network)
	if err != nil {
		return nil, err
	}
	out := make([]chainRules, 0, len(chains))
	for _, ch := range chains {
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, fmt.Errorf("failed to list rules of nftables chain %s %s %s: %w", famName(ch.Table.Family), ch.Table.Name, ch.Name, err)
		}
		out = append(out, chainRules{chain: ch, rules: rules})
	}
	return out, nil
}

func (nftBackend) ensure(s Spec) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("failed to open nftables for network %q: %w", s.Network, err)
	}
	t := ourTable(s.Network)
	// add + delete + add in one transaction: replaces whatever is there.
	c.AddTable(t)
	c.DelTable(t)
	if rules := s.masqRules(); len(rules) > 0 {
		c.AddTable(t)
		ch := c.AddChain(postroutingChain(t))
		for _, e := range rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e, UserData: tag(s.Network)})
		}
	}
	chains, err := forwardRules(c, s.Network)
	if err != nil {
		return err
	}
	for _, cr := range chains {
		ch, have := cr.chain, cr.rules
		want := s.acceptFor(cr)
		if acceptInPlace(have, s.Network, len(want)) {
			continue
		}
		for _, r := range have {
			if ours(r, s.Network) {
				if err := c.DelRule(r); err != nil {
					return fmt.Errorf("failed to delete rule %d of nftables chain %s %s: %w", r.Handle, ch.Table.Name, ch.Name, err)
				}
			}
		}
		for i := len(want) - 1; i >= 0; i-- {
			c.InsertRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: want[i], UserData: tag(s.Network)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to write nftables rules of network %q (table inet %s): %w", s.Network, t.Name, err)
	}
	return nil
}

// acceptInPlace: the chain holds exactly n rules of ours, and only rules
// of Village networks come before them.
func acceptInPlace(have []*nftables.Rule, network string, n int) bool {
	count := 0
	for _, r := range have {
		switch {
		case count == n:
			if ours(r, network) {
				return false
			}
		case ours(r, network):
			count++
		case !village(r):
			return false
		}
	}
	return count == n
}

// village: the rule carries the owner tag of some Village network.
func village(r *nftables.Rule) bool {
	c, ok := userdata.GetString(r.UserData, userdata.TypeComment)
	return ok && strings.HasPrefix(c, "village:")
}

func (nftBackend) check(s Spec) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	var errs []error
	t := ourTable(s.Network)
	want := s.masqRules()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("failed to list nftables tables: %w", err)
	}
	exists := false
	for _, tb := range tables {
		exists = exists || tb.Name == t.Name
	}
	switch {
	case !exists && len(want) > 0:
		errs = append(errs, fmt.Errorf("masquerade table inet %s of network %q missing from nftables", t.Name, s.Network))
	case exists && len(want) == 0:
		errs = append(errs, fmt.Errorf("table inet %s of network %q present although ipMasq is off", t.Name, s.Network))
	case exists:
		if err := checkPostrouting(c, t, s, want); err != nil {
			errs = append(errs, err)
		}
	}
	chains, err := forwardRules(c, s.Network)
	if err != nil {
		return err
	}
	for _, cr := range chains {
		ch, have := cr.chain, cr.rules
		n := len(s.acceptFor(cr))
		if !acceptInPlace(have, s.Network, n) {
			errs = append(errs, fmt.Errorf("forward accept rules of network %q are not at the top of nftables chain %s %s %s (want %d tagged %q)", s.Network, famName(ch.Table.Family), ch.Table.Name, ch.Name, n, Comment(s.Network)))
		}
	}
	return JoinLine(errs)
}

func checkPostrouting(c *nftables.Conn, t *nftables.Table, s Spec, want [][]expr.Any) error {
	ch, err := c.ListChain(t, "postrouting")
	if err != nil || ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting || ch.Type != nftables.ChainTypeNAT {
		return fmt.Errorf("masquerade chain postrouting of network %q missing from nftables table inet %s", s.Network, t.Name)
	}
	have, err := c.GetRules(t, ch)
	if err != nil {
		return fmt.Errorf("failed to list nftables chain inet %s postrouting: %w", t.Name, err)
	}
	if len(have) != len(want) {
		return fmt.Errorf("masquerade chain inet %s postrouting of network %q holds %d rules, want %d", t.Name, s.Network, len(have), len(want))
	}
	for i, r := range have {
		if !ours(r, s.Network) || !sameCmp(r.Exprs, want[i]) {
			return fmt.Errorf("masquerade chain inet %s postrouting of network %q: rule %d differs from what Village writes", t.Name, s.Network, i+1)
		}
	}
	return nil
}

// sameCmp compares the addresses two rules match on and their verdicts;
// that is what a changed spec or a hand edit changes.
func sameCmp(have, want []expr.Any) bool {
	sig := func(es []expr.Any) [][]byte {
		var out [][]byte
		for _, e := range es {
			switch e := e.(type) {
			case *expr.Cmp:
				out = append(out, e.Data)
			case *expr.Verdict:
				out = append(out, []byte{byte(e.Kind)})
			case *expr.Masq:
				out = append(out, []byte("masq"))
			}
		}
		return out
	}
	h, w := sig(have), sig(want)
	if len(h) != len(w) {
		return false
	}
	for i := range h {
		if !bytes.Equal(h[i], w[i]) {
			return false
		}
	}
	return true
}

func (nftBackend) teardown(network string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	t := ourTable(network)
	c.AddTable(t)
	c.DelTable(t)
	chains, err := forwardRules(c, network)
	if err != nil {
		return err
	}
	var errs []error
	for _, cr := range chains {
		for _, r := range cr.rules {
			if ours(r, network) {
				errs = append(errs, c.DelRule(r))
			}
		}
	}
	if err := c.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("failed to remove nftables rules of network %q: %w", network, err))
	}
	return errors.Join(errs...)
}

func famName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return fmt.Sprint(f)
}

func nftPresent(network string) []string {
	c, err := nftables.New()
	if err != nil {
		return nil
	}
	var out []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		if tables, err := c.ListTablesOfFamily(fam); err == nil {
			for _, t := range tables {
				if t.Name == Table(network) {
					out = append(out, "nftables table "+famName(fam)+" "+t.Name)
				}
			}
		}
	}
	chains, _ := forwardRules(c, network)
	for _, cr := range chains {
		for _, r := range cr.rules {
			if ours(r, network) {
				out = append(out, fmt.Sprintf("nftables rules in %s %s %s", famName(cr.chain.Table.Family), cr.chain.Table.Name, cr.chain.Name))
				break
			}
		}
	}
	return out
}
