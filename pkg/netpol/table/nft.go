package table

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/owner"
)

// Two tables per network, both hooked at forward:
//
//   - inet village_policy-<network> holds the compiled rules; Apply
//     replaces it whole (add, delete, add in one transaction), Update
//     changes only what differs from the last ruleset (update.go); either
//     way a packet sees the old rules or the new ones, never a mix.
//   - inet village_pending-<network> holds the sets pending4 and pending6
//     of pod addresses whose rules are not compiled yet and a chain that
//     drops their traffic. ADD (MarkPending) adds to them; Apply removes the
//     addresses it compiled in the very transaction that installs their
//     rules. This table outlives Apply, so a mark ADD makes while the agent
//     compiles is never lost.
//
// A drop in any base chain of a hook is final, so the two tables combine
// without an order between them.

// PolicyTable and PendingTable name the network's tables (owner.Table:
// no network's masquerade table has either name).
func PolicyTable(network string) string  { return owner.Table(owner.Policy, network) }
func PendingTable(network string) string { return owner.Table(owner.Pending, network) }

func inet(name string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
}

func forwardChain(t *nftables.Table, prio *nftables.ChainPriority) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: prio, Policy: &accept}
}

// chainName is the per-pod chain of one direction ("in" or "eg"), hashed
// when namespace and name are too long for the kernel's 255 bytes.
func chainName(dir, key string) string {
	n := dir + "." + key
	if len(n) > 255 {
		h := sha256.Sum256([]byte(key))
		n = dir + "." + hex.EncodeToString(h[:16])
	}
	return n
}

func setSpec(t *nftables.Table, name string, v6 bool) *nftables.Set {
	kt := nftables.TypeIPAddr
	if v6 {
		kt = nftables.TypeIP6Addr
	}
	return &nftables.Set{Table: t, Name: name, KeyType: kt, Interval: true}
}

func vmapSpec(t *nftables.Table, name string, v6 bool) *nftables.Set {
	kt := nftables.TypeIPAddr
	if v6 {
		kt = nftables.TypeIP6Addr
	}
	return &nftables.Set{Table: t, Name: name, KeyType: kt, DataType: nftables.TypeVerdict, IsMap: true}
}

// intervalElements are the elements of an interval set holding rs.
func intervalElements(rs []Range) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.From.AsSlice()})
		if next := r.To.Next(); next.IsValid() {
			out = append(out, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func addrElements(as []netip.Addr) []nftables.SetElement {
	out := make([]nftables.SetElement, len(as))
	for i, a := range as {
		out[i] = nftables.SetElement{Key: a.AsSlice()}
	}
	return out
}

// Expression builders.

func nfproto(v6 bool) []expr.Any {
	p := byte(unix.NFPROTO_IPV4)
	if v6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

// addr loads the source (src) or destination address into register 1.
func addr(v6, src bool) *expr.Payload {
	off, n := uint32(16), uint32(4)
	switch {
	case v6 && src:
		off, n = 8, 16
	case v6:
		off, n = 24, 16
	case src:
		off = 12
	}
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

func inSet(s *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}
}

func ports(cl Clause) []expr.Any {
	if cl.Proto == ProtoAny {
		return nil
	}
	out := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(cl.Proto)}}}
	if cl.PortFrom == 0 {
		return out
	}
	out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	if cl.PortFrom == cl.PortTo {
		return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(cl.PortFrom)})
	}
	return append(out, &expr.Range{Op: expr.CmpOpEq, Register: 1,
		FromData: binaryutil.BigEndian.PutUint16(cl.PortFrom), ToData: binaryutil.BigEndian.PutUint16(cl.PortTo)})
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func rule(t *nftables.Table, ch *nftables.Chain, parts ...[]expr.Any) *nftables.Rule {
	var e []expr.Any
	for _, p := range parts {
		e = append(e, p...)
	}
	return &nftables.Rule{Table: t, Chain: ch, Exprs: e}
}

func ctEstablished() []expr.Any {
	mask := binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	return []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}}
}

// neighbourDiscovery matches ICMPv6 types 133 to 137 (router and
// neighbour solicitation and advertisement, redirect): without them an
// isolated IPv6 pod could not even resolve its peers' MACs.
func neighbourDiscovery() []expr.Any {
	return append(nfproto(true),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}})
}

// linkLocal is the bridge's IPv6 link-local unicast traffic, one rule
// per address (source, destination) with the packet's address in
// fe80::/10 and, when bridge is set, iifname bridge (bridged frames reach
// the forward hook with the bridge as their input; routing never forwards
// link-local, so only frames between two ports of one bridge get here).
// Every pod has an fe80:: address on eth0 that no set holds (the policy
// and pending chains decide by the pod's listed addresses), and a pod
// with NET_ADMIN can add any other: dropped by scope, a pod cannot be
// reached past its rules at a link-local address whatever it is. Neighbour
// discovery, accepted before, keeps working.
func linkLocal(bridge string) [][]expr.Any {
	var out [][]expr.Any
	for _, src := range []bool{true, false} {
		var e []expr.Any
		if bridge != "" {
			e = append(e, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)})
		}
		e = append(e, nfproto(true)...)
		p := addr(true, src)
		p.Len = 2
		e = append(e, p,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0xff, 0xc0}, Xor: []byte{0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0xfe, 0x80}},
			&expr.Counter{}, verdict(expr.VerdictDrop))
		out = append(out, e)
	}
	return out
}

// ifname is name as the kernel compares interface names: NUL-padded to
// IFNAMSIZ.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// build queues the policy table of rs on c (after deleting what is there),
// each per-pod chain's drop counter starting at its count in counts (by
// chain name).
func build(c *nftables.Conn, rs *Ruleset, counts map[string]Counts) error {
	t := inet(PolicyTable(rs.Network))
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	sets := map[string]*nftables.Set{}
	for _, name := range sortedKeys(rs.Sets) {
		s := rs.Sets[name]
		spec := setSpec(t, name, s.V6)
		if err := addSet(c, spec, intervalElements(s.Ranges)); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		sets[name] = spec
	}
	maps := map[string]*nftables.Set{}
	mapElems := map[string][]nftables.SetElement{}
	for _, dir := range []string{"ingress", "egress"} {
		for _, v6 := range []bool{false, true} {
			name := dir + map[bool]string{false: "4", true: "6"}[v6]
			maps[name] = vmapSpec(t, name, v6)
		}
	}
	for _, p := range rs.Pods {
		for _, d := range p.directions() {
			ch := c.AddChain(&nftables.Chain{Name: chainName(d.name[:2], p.Key), Table: t})
			for _, ip := range p.IPs {
				name := mapName(d.name, ip)
				mapElems[name] = append(mapElems[name], jumpElement(ip, ch.Name))
			}
			addCounter(c, t, ch.Name, counts[ch.Name])
			addChainRules(c, ch, rs.Network, d, func(name string) *nftables.Set { return sets[name] })
		}
	}
	for _, name := range []string{"ingress4", "ingress6", "egress4", "egress6"} {
		if err := addSet(c, maps[name], mapElems[name]); err != nil {
			return fmt.Errorf("map %s: %w", name, err)
		}
	}
	fw := c.AddChain(forwardChain(t, nftables.ChainPriorityFilter))
	c.AddRule(rule(t, fw, neighbourDiscovery(), []expr.Any{verdict(expr.VerdictAccept)}))
	for _, ll := range linkLocal(rs.Bridge) {
		c.AddRule(rule(t, fw, ll))
	}
	c.AddRule(rule(t, fw, ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)}))
	for _, dir := range []string{"egress", "ingress"} {
		for _, v6 := range []bool{false, true} {
			m := maps[dir+map[bool]string{false: "4", true: "6"}[v6]]
			c.AddRule(rule(t, fw, nfproto(v6), []expr.Any{addr(v6, dir == "egress"),
				&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: 0}}))
		}
	}
	return nil
}

// direction is one chain of a pod: ingress or egress.
type direction struct {
	name  string // "ingress" or "egress"
	chain *Chain
}

// directions are the pod's chains that exist (a nil one allows all).
func (p *PodRules) directions() []direction {
	var out []direction
	for _, d := range []direction{{"ingress", p.Ingress}, {"egress", p.Egress}} {
		if d.chain != nil {
			out = append(out, d)
		}
	}
	return out
}

// mapName is the verdict map of a direction for ip's family.
func mapName(dir string, ip netip.Addr) string {
	if ip.Is6() {
		return dir + "6"
	}
	return dir + "4"
}

func jumpElement(ip netip.Addr, chain string) nftables.SetElement {
	return nftables.SetElement{Key: ip.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// addChainRules queues the rules of d into ch (empty): the clauses
// (clauseRules), then the tail. set gives the set a clause names. The
// chain's drop counter (addCounter) must be there or queued before.
func addChainRules(c *nftables.Conn, ch *nftables.Chain, network string, d direction, set func(string) *nftables.Set) {
	for _, r := range clauseRules(ch, d, set) {
		c.AddRule(r)
	}
	for _, r := range tail(ch, network, d.name) {
		c.AddRule(r)
	}
}

// clauseRules are the rules of d's clauses in ch: one rule per clause and
// family, returning what it matches.
func clauseRules(ch *nftables.Chain, d direction, set func(string) *nftables.Set) []*nftables.Rule {
	t := ch.Table
	var out []*nftables.Rule
	peerIsSrc := d.name == "ingress"
	for _, cl := range d.chain.Clauses {
		if cl.AnyPeer {
			out = append(out, rule(t, ch, ports(cl), []expr.Any{verdict(expr.VerdictReturn)}))
			continue
		}
		for _, fam := range []struct {
			v6  bool
			set string
		}{{false, cl.Set4}, {true, cl.Set6}} {
			if fam.set == "" {
				continue
			}
			out = append(out, rule(t, ch, nfproto(fam.v6), []expr.Any{addr(fam.v6, peerIsSrc), inSet(set(fam.set))}, ports(cl), []expr.Any{verdict(expr.VerdictReturn)}))
		}
	}
	return out
}

// tail is the end of a per-pod chain: a rule that sends at most
// SampleRate packets a second (a burst of as many) to NFLOG group
// LogGroup with LogPrefix and, having no verdict, lets them go on; then
// the drop, counted by the chain's counter object (addCounter), the exact
// count of what the chain dropped.
func tail(ch *nftables.Chain, network, dir string) []*nftables.Rule {
	return []*nftables.Rule{
		rule(ch.Table, ch, []expr.Any{
			&expr.Limit{Type: expr.LimitTypePkts, Rate: SampleRate, Unit: expr.LimitTimeSecond, Burst: SampleRate},
			&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX, Group: LogGroup, Data: []byte(LogPrefix(dir, network))},
		}),
		rule(ch.Table, ch, []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: ch.Name}, verdict(expr.VerdictDrop)}),
	}
}

// counterObj is the drop counter of chain name (the counter object of
// the same name), starting at from when it is made.
func counterObj(t *nftables.Table, name string, from Counts) *nftables.NamedObj {
	return &nftables.NamedObj{Table: t, Name: name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{Packets: from.Packets, Bytes: from.Bytes}}
}

// addCounter queues the drop counter of chain name, starting at from.
func addCounter(c *nftables.Conn, t *nftables.Table, name string, from Counts) {
	c.AddObj(counterObj(t, name, from))
}

// chunk is how many elements go in one netlink message: the element list
// is one attribute, whose length field has 16 bits (64 KiB), and an
// element takes up to about 100 bytes (an IPv6 key and a jump verdict).
const chunk = 400

// addSet queues a set and its elements, chunk elements a message (an
// interval's start and end stay in one message).
func addSet(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	if err := c.AddSet(s, nil); err != nil {
		return err
	}
	return chunked(elems, func(part []nftables.SetElement) error { return c.SetAddElements(s, part) })
}

// chunked calls f on elems chunk elements at a time, never splitting an
// interval's start from its end.
func chunked(elems []nftables.SetElement, f func([]nftables.SetElement) error) error {
	for len(elems) > 0 {
		n := min(chunk, len(elems))
		if n < len(elems) && elems[n].IntervalEnd {
			n++
		}
		if err := f(elems[:n]); err != nil {
			return err
		}
		elems = elems[n:]
	}
	return nil
}

// pendingSets are the network's pending sets (pending4, pending6).
func pendingSets(network string) (*nftables.Table, [2]*nftables.Set) {
	t := inet(PendingTable(network))
	return t, [2]*nftables.Set{
		{Table: t, Name: "pending4", KeyType: nftables.TypeIPAddr},
		{Table: t, Name: "pending6", KeyType: nftables.TypeIP6Addr},
	}
}

// ensurePending queues the pending table (kept when present: AddTable,
// AddSet and AddChain without a delete do not touch what exists) and its
// chain's rules, replaced.
func ensurePending(c *nftables.Conn, network, bridge string) error {
	t, sets := pendingSets(network)
	c.AddTable(t)
	for _, s := range sets {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 5)
	fw := c.AddChain(forwardChain(t, prio))
	c.FlushChain(fw)
	c.AddRule(rule(t, fw, neighbourDiscovery(), []expr.Any{verdict(expr.VerdictAccept)}))
	for _, ll := range linkLocal(bridge) {
		c.AddRule(rule(t, fw, ll))
	}
	for i, s := range sets {
		for _, src := range []bool{true, false} {
			c.AddRule(rule(t, fw, nfproto(i == 1), []expr.Any{addr(i == 1, src), inSet(s), &expr.Counter{}, verdict(expr.VerdictDrop)}))
		}
	}
	// A last rule that is not a drop: pkg/masq's forwardAccept puts its
	// accept rules at the top of every forward base chain that ends in a
	// drop, and an accept there would let a pending pod's traffic skip
	// the drops above.
	c.AddRule(rule(t, fw, []expr.Any{&expr.Counter{}}))
	return nil
}

// Apply installs rs in one transaction: the policy table replaced, the
// pending table made if missing, and the pending marks of the addresses
// rs compiled removed. It works in the calling thread's network namespace.
func Apply(rs *Ruleset) error {
	return install(rs, true, func(c *nftables.Conn) error {
		// The drop counts go on in the new table (drops.go). Apply is
		// also the repair of a table that cannot be read: then they start
		// again from zero rather than the repair failing.
		counts, err := readCounts(rs.Network)
		if err != nil {
			counts = nil
		}
		return build(c, rs, counts)
	})
}

// install is one transaction of rs: the pending table ensured (always
// with rewrite, else only when it is missing: rewriting its base chain
// costs a commit several milliseconds more), what queue queues for the
// policy table, and the pending marks of the addresses rs compiled
// removed.
func install(rs *Ruleset, rewrite bool, queue func(*nftables.Conn) error) error {
	c, err := open()
	if err != nil {
		return fmt.Errorf("failed to open nftables for the policies of network %q: %w", rs.Network, err)
	}
	// The marks to remove: only those present (deleting an absent element
	// fails the whole transaction). ADD never removes marks, so one
	// present now is present at Flush.
	marked, there, err := pending(rs.Network)
	if err != nil {
		return err
	}
	if rewrite || !there {
		if err := ensurePending(c, rs.Network, rs.Bridge); err != nil {
			return fmt.Errorf("pending table of network %q: %w", rs.Network, err)
		}
	}
	if err := queue(c); err != nil {
		return fmt.Errorf("policy table of network %q: %w", rs.Network, err)
	}
	if rewrite {
		if err := delLegacy(c, rs.Network); err != nil {
			return err
		}
	}
	if err := unmark(c, rs, marked); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to write the nftables policy tables of network %q: %w", rs.Network, err)
	}
	return nil
}

// unmark queues the removal of the pending marks (of those in marked) of
// the addresses rs compiled.
func unmark(c *nftables.Conn, rs *Ruleset, marked []netip.Addr) error {
	compiled := map[netip.Addr]bool{}
	for _, a := range rs.Compiled {
		compiled[a] = true
	}
	_, sets := pendingSets(rs.Network)
	var drop [2][]netip.Addr
	for _, a := range marked {
		if compiled[a] {
			i := map[bool]int{false: 0, true: 1}[a.Is6()]
			drop[i] = append(drop[i], a)
		}
	}
	for i, s := range sets {
		for part := range slices.Chunk(drop[i], chunk) {
			if err := c.SetDeleteElements(s, addrElements(part)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Pending lists the addresses marked pending (none when the table is
// missing).
func Pending(network string) ([]netip.Addr, error) {
	out, _, err := pending(network)
	return out, err
}

// pending is Pending, and whether the table is there.
func pending(network string) ([]netip.Addr, bool, error) {
	c, err := open()
	if err != nil {
		return nil, false, fmt.Errorf("failed to open nftables: %w", err)
	}
	if ok, err := tableExists(c, PendingTable(network)); !ok {
		return nil, false, err
	}
	_, sets := pendingSets(network)
	var out []netip.Addr
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, true, fmt.Errorf("failed to list set %s of table inet %s: %w", s.Name, s.Table.Name, err)
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, true, nil
}

// EnsurePending makes the network's pending table when it is missing
// (its chain's rules are written again when it is there; the marks it
// holds are kept) and marks ips pending in the same transaction. The
// policy controller's repair of a deleted pending table writes it first,
// on its own, with the marks the deletion took (Marks): a transaction of
// a few objects, after which a pod marked before is marked again and ADD
// marks new pods, while the compile of the pods added since the last one
// follows.
func EnsurePending(network, bridge string, ips []netip.Addr) error {
	c, err := open()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	if err := ensurePending(c, network, bridge); err != nil {
		return fmt.Errorf("pending table of network %q: %w", network, err)
	}
	if err := queueMarks(c, network, ips); err != nil {
		return fmt.Errorf("pending table of network %q: %w", network, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to write table inet %s (and %d pending marks): %w", PendingTable(network), len(ips), err)
	}
	return nil
}

// ErrNoController says the network has no pending table: its policy
// controller is off or has not started, so there is nothing to wait for.
var ErrNoController = errors.New("no policy controller on this node")

// MarkPending adds ips to the network's pending sets, so their traffic
// drops until Apply compiles them. ErrNoController when the pending table
// is missing.
func MarkPending(network string, ips []netip.Addr) error {
	c, err := open()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	if ok, err := tableExists(c, PendingTable(network)); err != nil {
		return err
	} else if !ok {
		return ErrNoController
	}
	if err := queueMarks(c, network, ips); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to mark %v pending in table inet %s: %w", ips, PendingTable(network), err)
	}
	return nil
}

// queueMarks queues the addition of ips to the network's pending sets.
func queueMarks(c *nftables.Conn, network string, ips []netip.Addr) error {
	_, sets := pendingSets(network)
	var by [2][]netip.Addr
	for _, a := range ips {
		a = a.Unmap()
		i := map[bool]int{false: 0, true: 1}[a.Is6()]
		by[i] = append(by[i], a)
	}
	for i, s := range sets {
		if len(by[i]) > 0 {
			if err := c.SetAddElements(s, addrElements(by[i])); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove deletes both tables of the network (absent ones are fine).
func Remove(network string) error {
	c, err := open()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	for _, name := range []string{PolicyTable(network), PendingTable(network)} {
		t := inet(name)
		c.AddTable(t)
		c.DelTable(t)
	}
	if err := delLegacy(c, network); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to remove the nftables policy tables of network %q: %w", network, err)
	}
	return nil
}

// delLegacy queues the removal of the network's policy tables under
// their names before owner.Table's scheme (owner.Legacy:
// village-policy-<network>, village-pending-<network>), so a node
// upgraded with them drops their rules in the transaction that installs
// the new tables (Apply) or removes them (Remove). Such a name may instead
// be the masquerade table of network "policy-<network>" or
// "pending-<network>", which is left alone: an old policy table is known
// by its verdict map ingress4, an old pending table by its set pending4,
// and a masquerade table has no set.
func delLegacy(c *nftables.Conn, network string) error {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("failed to list nftables tables: %w", err)
	}
	for _, l := range []struct {
		job owner.Job
		set string
	}{{owner.Policy, "ingress4"}, {owner.Pending, "pending4"}} {
		name := owner.Legacy(l.job, network)
		if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == name }) {
			continue
		}
		t := inet(name)
		sets, err := c.GetSets(t)
		if err != nil {
			return fmt.Errorf("failed to list the sets of table inet %s: %w", name, err)
		}
		if slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == l.set }) {
			c.DelTable(t)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// tableExists says whether table inet name is there.
func tableExists(c *nftables.Conn, name string) (bool, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("failed to list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// bufSize is the netlink socket buffer a transaction gets: a table of a
// thousand isolated pods is a batch of some megabytes, sent in one
// sendmsg (a batch cannot span two), which the default buffer (about
// 200 KiB) refuses with EMSGSIZE; the kernel's acks of every message of
// it come back through the receive buffer.
const bufSize = 64 << 20

// bigBuffers raises both buffers past the sysctl limits (SO_*BUFFORCE
// needs CAP_NET_ADMIN, which whoever writes nftables has), or as far as
// they allow.
func bigBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var forced error
	if err := raw.Control(func(fd uintptr) {
		forced = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufSize),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufSize))
	}); err != nil {
		return err
	}
	if forced != nil {
		_ = c.SetWriteBuffer(bufSize)
		_ = c.SetReadBuffer(bufSize)
	}
	return nil
}

// open is nftables.New with bigBuffers.
func open() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(bigBuffers))
}
