package masq

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/nodelocal"
)

// macspoofchk: the source checks of each pod port, in the network's
// bridge-family table, over netlink like the rest of the nftables backend
// (whatever the masquerade backend is):
//
//	table bridge village-<net>
//	  chain macspoofchk  type filter hook prerouting priority -300
//	    iifname "<host veth>" ether saddr != <pod MAC> drop                 comment "village:<net> <host veth>"
//	    iifname "<host veth>" meta protocol ip ip saddr != <pod IPv4> drop   (same comment)
//	    iifname "<host veth>" meta protocol arp arp saddr ip != { <pod IPv4>, 0.0.0.0 } drop
//	    iifname "<host veth>" meta protocol ip6 ip6 saddr != { <pod IPv6>, ::, fe80::/10 } drop
//
// A pod that sends with any other source MAC (a changed eth0 address, a
// raw socket) has its frames dropped before the bridge learns or forwards
// them. The address rules (when the port has IPs: with networkPolicy on)
// do the same for a source address that is not the pod's: NetworkPolicy
// decides by the packet's source address, so a pod must not borrow one
// another pod is allowed with, nor dodge its own egress policy or pending
// mark with an address nobody holds, nor claim another pod's IPv4 address
// in ARP. IPv6 keeps the unspecified and link-local sources neighbour
// discovery needs (what a pod reaches at link-local is the policy's
// business, pkg/netpol/table); ARP keeps the probe's 0.0.0.0. A family
// the pod has no address of is refused whole but for those.

// SpoofCheck is the source check of one pod port.
type SpoofCheck struct {
	Network  string
	HostVeth string
	// MAC, when set, is the only source MAC the port may send with.
	MAC net.HardwareAddr
	// IPs, when set, are the only source addresses (IPv4, IPv6, ARP) the
	// port may send with, beside those of neighbour discovery.
	IPs []netip.Addr
	// Bridge, when set, is the network's bridge: EnsureSpoofCheck and
	// DeleteSpoofCheck move the netfilter stamps on it past their own write
	// (see passOwnWrite), so the rule of one pod does not send the next
	// ADD's Keep to look at the rules again.
	Bridge string
}

func spoofTable(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyBridge, Name: Table(network)}
}

func spoofChain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: "macspoofchk", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-300)}
}

func spoofTag(network, hostVeth string) string { return Comment(network) + " " + hostVeth }

// rules are the port's rules, the MAC check first.
func (sc SpoofCheck) rules() [][]expr.Any {
	name := make([]byte, 16)
	copy(name, sc.HostVeth)
	iif := func() []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
		}
	}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	var out [][]expr.Any
	if len(sc.MAC) > 0 {
		r := append(iif(),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(sc.MAC)})
		out = append(out, append(r, drop...))
	}
	if len(sc.IPs) == 0 {
		return out
	}
	var v4, v6 [][]byte
	for _, a := range sc.IPs {
		if a.Is4() || a.Is4In6() {
			b := a.Unmap().As4()
			v4 = append(v4, b[:])
		} else {
			b := a.As16()
			v6 = append(v6, b[:])
		}
	}
	proto := func(ethertype uint16) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(ethertype >> 8), byte(ethertype)}},
		}
	}
	notAny := func(allowed [][]byte) []expr.Any {
		var es []expr.Any
		for _, a := range allowed {
			es = append(es, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a})
		}
		return es
	}
	// IPv4: the source address at offset 12 of the IP header.
	r := append(iif(), proto(0x0800)...)
	r = append(r, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4})
	out = append(out, append(append(r, notAny(v4)...), drop...))
	// ARP (Ethernet, IPv4): the sender's protocol address at offset 14.
	r = append(iif(), proto(0x0806)...)
	r = append(r, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4})
	out = append(out, append(append(r, notAny(append(slices.Clone(v4), make([]byte, 4)))...), drop...))
	// IPv6: the source address at offset 8; ::, and fe80::/10 (masked
	// into register 2).
	r = append(iif(), proto(0x86dd)...)
	r = append(r, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16})
	r = append(r, notAny(append(slices.Clone(v6), make([]byte, 16)))...)
	mask, linkLocal := make([]byte, 16), make([]byte, 16)
	mask[0], mask[1] = 0xff, 0xc0
	linkLocal[0], linkLocal[1] = 0xfe, 0x80
	r = append(r,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 2, Len: 16, Mask: mask, Xor: make([]byte, 16)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 2, Data: linkLocal})
	out = append(out, append(r, drop...))
	return out
}

// samePortRules reports whether have are exactly the rules want, in order.
func samePortRules(have []*nftables.Rule, want [][]expr.Any) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range want {
		if !sameCmp(have[i].Exprs, want[i]) {
			return false
		}
	}
	return true
}

// spoofRules returns the table's chain and the rules tagged for hostVeth
// (nil chain when the table or chain is missing).
func spoofRules(c *nftables.Conn, network, hostVeth string) (*nftables.Chain, []*nftables.Rule) {
	t := spoofTable(network)
	ch, err := c.ListChain(t, "macspoofchk")
	if err != nil {
		return nil, nil
	}
	rules, err := c.GetRules(t, ch)
	if err != nil {
		return nil, nil
	}
	var out []*nftables.Rule
	for _, r := range rules {
		if tag, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && tag == spoofTag(network, hostVeth) {
			out = append(out, r)
		}
	}
	return ch, out
}

// EnsureSpoofCheck installs (or replaces) the pod port's rule.
func EnsureSpoofCheck(sc SpoofCheck) error {
	c, unlock, err := lockedConn()
	if err != nil {
		return err
	}
	defer unlock()
	before, genErr := GenID()
	if err := writeSpoofCheck(c, sc, nil); err != nil {
		return err
	}
	return passOwnWrite(sc.Bridge, before, genErr)
}

// passOwnWrite moves the netfilter stamps on bridge ("" for none) past the
// caller's own nf_tables transaction, made after it read the generation
// before (or failed to: genErr), with the lock held. Only when it was
// exactly one transaction since before: a pod's macspoofchk rule, which
// holds nothing a stamp vouches for. Anything more (someone else's write in
// between) and the stamps stay, and the next Keep looks.
func passOwnWrite(bridge string, before uint32, genErr error) error {
	if bridge == "" || genErr != nil {
		return nil
	}
	if after, err := GenID(); err != nil || after != before+1 {
		return nil
	}
	br, err := bridgeOf(bridge)
	if err != nil || br == nil {
		return err
	}
	alias := aliasOf(br)
	if moved := advanceStamps(alias, before, before+1); moved != alias {
		if err := netlink.LinkSetAlias(br, moved); err != nil {
			return fmt.Errorf("failed to record the netfilter stamp on bridge %q: %w", bridge, err)
		}
	}
	return nil
}

// writeSpoofCheck replaces the pod port's rule, the lock held; old are
// the port's rules when the caller has listed them already (nil: listed
// here).
func writeSpoofCheck(c *nftables.Conn, sc SpoofCheck, old []*nftables.Rule) error {
	t := c.AddTable(spoofTable(sc.Network))
	ch := c.AddChain(spoofChain(t))
	if old == nil {
		_, old = spoofRules(c, sc.Network, sc.HostVeth)
	}
	for _, r := range old {
		if err := c.DelRule(r); err != nil {
			return fmt.Errorf("failed to replace the macspoofchk rule of %q: %w", sc.HostVeth, err)
		}
	}
	if err := recordSpoof(sc); err != nil {
		return err
	}
	for _, r := range sc.rules() {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r,
			UserData: userdata.AppendString(nil, userdata.TypeComment, spoofTag(sc.Network, sc.HostVeth))})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to write the macspoofchk rule of %q (nftables table bridge %s): %w", sc.HostVeth, Table(sc.Network), err)
	}
	return nil
}

// CheckSpoofCheck reports a missing or changed rule of the pod port.
func CheckSpoofCheck(sc SpoofCheck) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	_, rules := spoofRules(c, sc.Network, sc.HostVeth)
	if !samePortRules(rules, sc.rules()) {
		return fmt.Errorf("macspoofchk rule of %q (source MAC %s, addresses %v) missing or changed in nftables table bridge %s", sc.HostVeth, sc.MAC, sc.IPs, Table(sc.Network))
	}
	return nil
}

// DeleteSpoofCheck removes the rule of the pod port sc.HostVeth (sc.MAC is
// not needed); a missing one is fine. With sc.Bridge the stamps on it move
// past the delete, as EnsureSpoofCheck's do past the write.
func DeleteSpoofCheck(sc SpoofCheck) error {
	c, unlock, err := lockedConn()
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(spoofFile(sc.Network, sc.HostVeth)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("failed to remove the macspoofchk record of %q: %w", sc.HostVeth, err)
	}
	_, rules := spoofRules(c, sc.Network, sc.HostVeth)
	if len(rules) == 0 {
		return nil
	}
	for _, r := range rules {
		if err := c.DelRule(r); err != nil {
			return err
		}
	}
	before, genErr := GenID()
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to delete the macspoofchk rule of %q: %w", sc.HostVeth, err)
	}
	return passOwnWrite(sc.Bridge, before, genErr)
}

// deleteSpoofTable drops the network's bridge table with every pod's rule.
func deleteSpoofTable(network string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	t := spoofTable(network)
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to delete nftables table bridge %s: %w", t.Name, err)
	}
	return nil
}

// spoofFile is the record of one pod port with source checks, in the
// network's directory under the run directory (nodelocal.SpoofDir): one
// file per port, named after the host veth, holding the pod MAC on its
// first line ("" when only addresses are checked) and one pod address on
// each line after it, so the rules can be rebuilt for every pod of the
// bridge after a flush, not only for the pod at hand. It follows
// $VILLAGE_RUN_DIR as the network's other files do (it describes this
// network's ports, as the subnet file its subnet).
func spoofFile(network, hostVeth string) string {
	return filepath.Join(nodelocal.SpoofDir("", network), hostVeth)
}

func recordSpoof(sc SpoofCheck) error {
	f := spoofFile(sc.Network, sc.HostVeth)
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return fmt.Errorf("failed to create %s: %w", filepath.Dir(f), err)
	}
	lines := []string{sc.MAC.String()}
	for _, a := range sc.IPs {
		lines = append(lines, a.String())
	}
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("failed to record the source check of %q: %w", sc.HostVeth, err)
	}
	return nil
}

// parseSpoofRecord reads a record of spoofFile (a record of an older
// release holds the MAC alone).
func parseSpoofRecord(network, hostVeth string, b []byte) (SpoofCheck, error) {
	sc := SpoofCheck{Network: network, HostVeth: hostVeth}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if m := strings.TrimSpace(lines[0]); m != "" {
		mac, err := net.ParseMAC(m)
		if err != nil {
			return sc, fmt.Errorf("source check record of %q: %w", hostVeth, err)
		}
		sc.MAC = mac
	}
	for _, l := range lines[1:] {
		a, err := netip.ParseAddr(strings.TrimSpace(l))
		if err != nil {
			return sc, fmt.Errorf("source check record of %q: %w", hostVeth, err)
		}
		sc.IPs = append(sc.IPs, a)
	}
	if len(sc.MAC) == 0 && len(sc.IPs) == 0 {
		return sc, fmt.Errorf("source check record of %q is empty", hostVeth)
	}
	return sc, nil
}

// restoreSpoofChecks puts back the macspoofchk rule of every port of the
// bridge (index bridge) with a recorded pod MAC, when it is missing or
// changed; the caller holds the lock. The chain is read once for all ports.
// It returns the host veths whose rule it restored.
func restoreSpoofChecks(network string, bridge int, runDir string) ([]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("failed to list links for macspoofchk of network %q: %w", network, err)
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("failed to open nftables: %w", err)
	}
	byTag := map[string][]*nftables.Rule{}
	t := spoofTable(network)
	if ch, err := c.ListChain(t, "macspoofchk"); err == nil {
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return nil, fmt.Errorf("failed to list the macspoofchk rules of network %q: %w", network, err)
		}
		for _, r := range rules {
			if tag, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok {
				byTag[tag] = append(byTag[tag], r)
			}
		}
	}
	var restored []string
	for _, l := range links {
		a := l.Attrs()
		if a.MasterIndex != bridge {
			continue
		}
		b, err := os.ReadFile(filepath.Join(nodelocal.SpoofDir(runDir, network), a.Name))
		if err != nil {
			continue
		}
		sc, err := parseSpoofRecord(network, a.Name, b)
		if err != nil {
			continue
		}
		have := byTag[spoofTag(network, a.Name)]
		if samePortRules(have, sc.rules()) {
			continue
		}
		if err := writeSpoofCheck(c, sc, have); err != nil {
			return restored, err
		}
		restored = append(restored, a.Name)
	}
	return restored, nil
}

// lockedConn takes the lock and opens nftables.
func lockedConn() (*nftables.Conn, func(), error) {
	unlock, err := lock()
	if err != nil {
		return nil, nil, err
	}
	c, err := nftables.New()
	if err != nil {
		unlock()
		return nil, nil, fmt.Errorf("failed to open nftables: %w", err)
	}
	return c, unlock, nil
}
