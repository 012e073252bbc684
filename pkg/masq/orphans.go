package masq

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netlink"
)

// Orphans lists Village's netfilter objects on this node that no network
// uses any more, of any network and in both backends, each line naming the
// object and why (their network's rules were removed, they were not):
//
//   - iptables: a chain VLG-MASQ-… that no nat POSTROUTING rule jumps to,
//     a chain VLG-FWD-… that no filter FORWARD rule jumps to (iptables and
//     ip6tables; only where an iptables binary exists);
//   - nftables: a table inet village-… that holds no rule, a macspoofchk
//     rule in a table bridge village-… whose host veth is gone.
//
// It writes nothing.
func Orphans() []string {
	var out []string
	if Detect().IPTables != "" {
		out = append(out, iptOrphans()...)
	}
	return append(out, nftOrphans()...)
}

func iptOrphans() []string {
	var lines []string
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := newIPT(proto)
		if err != nil {
			continue
		}
		for _, p := range []struct{ table, hook, prefix, what string }{
			{natTable, postrouting, "VLG-MASQ-", "masquerade"},
			{filterTable, forward, "VLG-FWD-", "forward accept"},
		} {
			chains, err := ipt.ListChains(p.table)
			if err != nil {
				continue
			}
			rules, _ := ipt.List(p.table, p.hook)
			for _, ch := range chains {
				if !strings.HasPrefix(ch, p.prefix) {
					continue
				}
				if !slices.ContainsFunc(rules, func(r string) bool { return strings.HasSuffix(r, "-j "+ch) }) {
					lines = append(lines, fmt.Sprintf("%s chain %s (%s %s): no %s rule jumps to it", p.what, ch, cmdName(proto), p.table, p.hook))
				}
			}
		}
	}
	return lines
}

func nftOrphans() []string {
	c, err := nftables.New()
	if err != nil {
		return nil
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil
	}
	var lines []string
	for _, t := range tables {
		if !strings.HasPrefix(t.Name, "village-") {
			continue
		}
		switch t.Family {
		case nftables.TableFamilyINet:
			if rules := tableRules(c, t); len(rules) == 0 {
				lines = append(lines, fmt.Sprintf("masquerade table inet %s (nftables): holds no rule", t.Name))
			}
		case nftables.TableFamilyBridge:
			for _, r := range tableRules(c, t) {
				tag, ok := userdata.GetString(r.UserData, userdata.TypeComment)
				_, veth, found := strings.Cut(tag, " ")
				if !ok || !found || !strings.HasPrefix(tag, "village:") {
					continue
				}
				var nf netlink.LinkNotFoundError
				if _, err := netlinksafe.LinkByName(veth); errors.As(err, &nf) {
					lines = append(lines, fmt.Sprintf("macspoofchk rule of %s (nftables table bridge %s): the host veth is gone", veth, t.Name))
				}
			}
		}
	}
	return lines
}

// tableRules lists the rules of every chain of t.
func tableRules(c *nftables.Conn, t *nftables.Table) []*nftables.Rule {
	chains, err := c.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil
	}
	var out []*nftables.Rule
	for _, ch := range chains {
		if ch.Table.Name != t.Name {
			continue
		}
		rules, err := c.GetRules(t, ch)
		if err == nil {
			out = append(out, rules...)
		}
	}
	return out
}
