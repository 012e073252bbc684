package netpol

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/village-cni/village/pkg/netpol/table"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Compile computes the table of in.Network for the pods in in.Local. It
// never fails: what it cannot enforce is in the result's Problems (the
// rest of that policy still applies; a rule it cannot read matches
// nothing, so an error never opens traffic).
func Compile(in Input) *table.Ruleset {
	c := &compiler{in: in, rs: &table.Ruleset{Network: in.Network, Bridge: in.Bridge, Sets: map[string]table.Set{}}, seen: map[table.Problem]bool{}}
	c.index()
	for _, p := range c.pods {
		if !in.Local[p.Key()] || p.HostNetwork || len(p.IPs) == 0 {
			continue
		}
		c.rs.Compiled = append(c.rs.Compiled, p.IPs...)
		if pr, ok := c.pod(p); ok {
			c.rs.Pods = append(c.rs.Pods, pr)
		}
	}
	for _, p := range c.pods {
		if in.Local[p.Key()] && p.HostNetwork {
			for _, pol := range c.selecting(p) {
				c.problem(pol, "selects hostNetwork pod "+p.Key()+", whose traffic is the node's own: not filtered")
			}
		}
	}
	c.rs.Namespaces = slices.Sorted(maps.Keys(c.byNS))
	slices.SortFunc(c.rs.Compiled, netip.Addr.Compare)
	slices.SortFunc(c.rs.Problems, func(a, b table.Problem) int {
		return strings.Compare(a.Policy+"\x00"+a.Reason, b.Policy+"\x00"+b.Reason)
	})
	return c.rs
}

type compiler struct {
	in   Input
	rs   *table.Ruleset
	seen map[table.Problem]bool
	pods []*Pod // sorted by key
	// byNS are the policies of each namespace, sorted by name.
	byNS map[string][]*networkingv1.NetworkPolicy
	// podSel and peerCache memoise selectors and peers per policy.
	podSel    map[*networkingv1.NetworkPolicy]labels.Selector
	peerCache map[string]peers
	setCache  map[string][2]string
}

func (c *compiler) index() {
	c.pods = slices.Clone(c.in.Pods)
	slices.SortFunc(c.pods, func(a, b *Pod) int { return strings.Compare(a.Key(), b.Key()) })
	c.byNS = map[string][]*networkingv1.NetworkPolicy{}
	c.podSel = map[*networkingv1.NetworkPolicy]labels.Selector{}
	c.peerCache = map[string]peers{}
	c.setCache = map[string][2]string{}
	for _, pol := range c.in.Policies {
		if pol == nil {
			continue
		}
		c.byNS[pol.Namespace] = append(c.byNS[pol.Namespace], pol)
		sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
		if err != nil {
			c.problem(pol, fmt.Sprintf("spec.podSelector: %v: the policy selects no pod", err))
			sel = labels.Nothing()
		}
		c.podSel[pol] = sel
	}
	for _, ps := range c.byNS {
		slices.SortFunc(ps, func(a, b *networkingv1.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	}
}

func key(pol *networkingv1.NetworkPolicy) string { return pol.Namespace + "/" + pol.Name }

func (c *compiler) problem(pol *networkingv1.NetworkPolicy, reason string) {
	p := table.Problem{Policy: key(pol), Reason: reason}
	if !c.seen[p] {
		c.seen[p] = true
		c.rs.Problems = append(c.rs.Problems, p)
	}
}

// selecting are the policies whose podSelector selects p.
func (c *compiler) selecting(p *Pod) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, pol := range c.byNS[p.Namespace] {
		if c.podSel[pol].Matches(labels.Set(p.Labels)) {
			out = append(out, pol)
		}
	}
	return out
}

// types are the directions a policy isolates.
func (c *compiler) types(pol *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(pol.Spec.PolicyTypes) == 0 {
		return true, len(pol.Spec.Egress) > 0
	}
	for _, t := range pol.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			c.problem(pol, fmt.Sprintf("spec.policyTypes: unknown type %q ignored", t))
		}
	}
	return ingress, egress
}

// pod compiles the chains of a local pod; false when no policy isolates it.
func (c *compiler) pod(p *Pod) (table.PodRules, bool) {
	pr := table.PodRules{Key: p.Key(), IPs: slices.Clone(p.IPs)}
	slices.SortFunc(pr.IPs, netip.Addr.Compare)
	for _, pol := range c.selecting(p) {
		in, eg := c.types(pol)
		if p.LAN && (in || eg) {
			c.problem(pol, "selects pod "+p.Key()+", whose LAN interface (net1, macvlan) bypasses the node's netfilter: only its eth0 traffic is filtered")
		}
		if in {
			if pr.Ingress == nil {
				pr.Ingress = &table.Chain{}
			}
			for i, r := range pol.Spec.Ingress {
				pr.Ingress.Clauses = append(pr.Ingress.Clauses, c.rule(pol, p, false, i, r.From, r.Ports)...)
			}
		}
		if eg {
			if pr.Egress == nil {
				pr.Egress = &table.Chain{}
			}
			for i, r := range pol.Spec.Egress {
				pr.Egress.Clauses = append(pr.Egress.Clauses, c.rule(pol, p, true, i, r.To, r.Ports)...)
			}
		}
	}
	pr.Ingress, pr.Egress = dedupe(pr.Ingress), dedupe(pr.Egress)
	return pr, pr.Ingress != nil || pr.Egress != nil
}

// dedupe drops repeated clauses (two policies allowing the same).
func dedupe(ch *table.Chain) *table.Chain {
	if ch == nil {
		return nil
	}
	seen := map[table.Clause]bool{}
	out := &table.Chain{Clauses: []table.Clause{}}
	for _, cl := range ch.Clauses {
		if !seen[cl] {
			seen[cl] = true
			out.Clauses = append(out.Clauses, cl)
		}
	}
	return out
}

// peers are what the from/to list of one rule selects.
type peers struct {
	any    bool
	pods   []*Pod
	blocks []table.Range
}

func (c *compiler) peers(pol *networkingv1.NetworkPolicy, origin string, list []networkingv1.NetworkPolicyPeer) peers {
	if ps, ok := c.peerCache[origin]; ok {
		return ps
	}
	var ps peers
	if len(list) == 0 {
		ps.any = true
	}
	chosen := map[*Pod]bool{}
	for i, peer := range list {
		where := fmt.Sprintf("%s[%d]", origin[strings.LastIndex(origin, "|")+1:], i)
		if peer.IPBlock != nil {
			if peer.PodSelector != nil || peer.NamespaceSelector != nil {
				c.problem(pol, where+": ipBlock together with a selector is invalid: the peer matches nothing")
				continue
			}
			ps.blocks = append(ps.blocks, c.block(pol, where, peer.IPBlock)...)
			continue
		}
		if peer.PodSelector == nil && peer.NamespaceSelector == nil {
			c.problem(pol, where+": empty peer: matches nothing")
			continue
		}
		podSel, nsSel := labels.Everything(), labels.Selector(nil)
		var err error
		if peer.PodSelector != nil {
			if podSel, err = metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
				c.problem(pol, fmt.Sprintf("%s.podSelector: %v: the peer matches nothing", where, err))
				continue
			}
		}
		if peer.NamespaceSelector != nil {
			if nsSel, err = metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
				c.problem(pol, fmt.Sprintf("%s.namespaceSelector: %v: the peer matches nothing", where, err))
				continue
			}
		}
		for _, p := range c.pods {
			if p.HostNetwork || len(p.IPs) == 0 || chosen[p] {
				continue
			}
			if nsSel == nil && p.Namespace != pol.Namespace {
				continue
			}
			if nsSel != nil {
				nsLabels, ok := c.in.Namespaces[p.Namespace]
				if !ok || !nsSel.Matches(labels.Set(nsLabels)) {
					continue
				}
			}
			if podSel.Matches(labels.Set(p.Labels)) {
				chosen[p] = true
				ps.pods = append(ps.pods, p)
			}
		}
	}
	c.peerCache[origin] = ps
	return ps
}

// block is an ipBlock less its excepts.
func (c *compiler) block(pol *networkingv1.NetworkPolicy, where string, b *networkingv1.IPBlock) []table.Range {
	p, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		c.problem(pol, fmt.Sprintf("%s.ipBlock.cidr %q: %v: the peer matches nothing", where, b.CIDR, err))
		return nil
	}
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-map[bool]int{true: 96, false: 0}[p.Addr().Is4In6()])
	var cut []table.Range
	for _, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			c.problem(pol, fmt.Sprintf("%s.ipBlock.except %q: %v: the peer matches nothing", where, e, err))
			return nil
		}
		if ep.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		cut = append(cut, prefixRange(ep))
	}
	return subtract(prefixRange(p), cut)
}

// rule compiles one ingress (egress false) or egress rule for target pod
// p. Named ports resolve against p for ingress and against each peer pod
// for egress.
func (c *compiler) rule(pol *networkingv1.NetworkPolicy, p *Pod, egress bool, i int, list []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) []table.Clause {
	dir := map[bool]string{false: "ingress", true: "egress"}[egress]
	field := map[bool]string{false: "from", true: "to"}[egress]
	origin := fmt.Sprintf("%s|%s|%d|%s", key(pol), dir, i, fmt.Sprintf("spec.%s[%d].%s", dir, i, field))
	return c.ruleOf(pol, p, egress, i, origin, list, ports)
}

// ruleOf is rule with the peer list's origin (which names its peer sets)
// given: the Model (why.go) compiles each peer of a rule on its own, under
// an origin of its own, to say which peer admits a packet.
func (c *compiler) ruleOf(pol *networkingv1.NetworkPolicy, p *Pod, egress bool, i int, origin string, list []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) []table.Clause {
	dir := map[bool]string{false: "ingress", true: "egress"}[egress]
	ps := c.peers(pol, origin, list)
	allPorts := len(ports) == 0
	if allPorts {
		ports = []networkingv1.NetworkPolicyPort{{}}
	}
	var out []table.Clause
	for j, port := range ports {
		where := fmt.Sprintf("spec.%s[%d].ports[%d]", dir, i, j)
		proto, ok := protoOf(port)
		if !ok {
			c.problem(pol, fmt.Sprintf("%s: protocol %q: the port matches nothing", where, *port.Protocol))
			continue
		}
		if allPorts {
			proto = table.ProtoAny
		}
		switch {
		case port.Port == nil:
			if port.EndPort != nil {
				c.problem(pol, where+": endPort without port: the port matches nothing")
				continue
			}
			out = append(out, c.clause(ps, origin, "", table.Clause{Proto: proto})...)
		case port.Port.Type == intstr.Int:
			from, to := port.Port.IntVal, port.Port.IntVal
			if port.EndPort != nil {
				to = *port.EndPort
			}
			if from < 1 || from > 65535 || to < from || to > 65535 {
				c.problem(pol, fmt.Sprintf("%s: port %d..%d out of range: the port matches nothing", where, from, to))
				continue
			}
			out = append(out, c.clause(ps, origin, "", table.Clause{Proto: proto, PortFrom: uint16(from), PortTo: uint16(to)})...)
		default:
			name := port.Port.StrVal
			if port.EndPort != nil {
				c.problem(pol, fmt.Sprintf("%s: endPort with the named port %q is invalid: the port matches nothing", where, name))
				continue
			}
			if !egress {
				if n, ok := resolve(p.Ports, name, proto); ok {
					out = append(out, c.clause(ps, origin, "", table.Clause{Proto: proto, PortFrom: n, PortTo: n})...)
				}
				continue
			}
			out = append(out, c.namedEgress(ps, origin, name, proto)...)
		}
	}
	return out
}

// protoOf is the protocol of a policy port as the compile reads it (TCP
// when not given); false for one it does not know (the compile reports
// it).
func protoOf(port networkingv1.NetworkPolicyPort) (table.Proto, bool) {
	if port.Protocol == nil {
		return table.ProtoTCP, true
	}
	switch *port.Protocol {
	case corev1.ProtocolTCP:
		return table.ProtoTCP, true
	case corev1.ProtocolUDP:
		return table.ProtoUDP, true
	case corev1.ProtocolSCTP:
		return table.ProtoSCTP, true
	}
	return table.ProtoAny, false
}

// resolve finds the number of the container port called name among a
// pod's ports (the compile's and `villaged why`'s one resolution).
func resolve(ports []NamedPort, name string, proto table.Proto) (uint16, bool) {
	for _, np := range ports {
		if np.Name == name && np.Protocol == proto {
			return np.Port, true
		}
	}
	return 0, false
}

// namedEgress splits the peer pods by the number their port called name
// has: one clause per number. Addresses of ipBlocks have no named ports.
func (c *compiler) namedEgress(ps peers, origin, name string, proto table.Proto) []table.Clause {
	cands := ps.pods
	if ps.any {
		cands = nil
		for _, p := range c.pods {
			if !p.HostNetwork && len(p.IPs) > 0 {
				cands = append(cands, p)
			}
		}
	}
	byPort := map[uint16][]*Pod{}
	for _, p := range cands {
		if n, ok := resolve(p.Ports, name, proto); ok {
			byPort[n] = append(byPort[n], p)
		}
	}
	var out []table.Clause
	for _, n := range slices.Sorted(maps.Keys(byPort)) {
		group := peers{pods: byPort[n]}
		out = append(out, c.clause(group, origin, fmt.Sprintf("%s/%d", proto, n), table.Clause{Proto: proto, PortFrom: n, PortTo: n})...)
	}
	return out
}

// clause fills in the peer sets of cl from ps; none when ps matches no
// address.
func (c *compiler) clause(ps peers, origin, group string, cl table.Clause) []table.Clause {
	if ps.any {
		cl.AnyPeer = true
		return []table.Clause{cl}
	}
	k := origin + "|" + group
	names, ok := c.setCache[k]
	if !ok {
		names = c.sets(ps, k)
		c.setCache[k] = names
	}
	cl.Set4, cl.Set6 = names[0], names[1]
	if cl.Set4 == "" && cl.Set6 == "" {
		return nil
	}
	return []table.Clause{cl}
}

// sets makes the peer sets of ps, named after their origin k, once per
// compile (every pod a rule applies to shares them): the IPv4 and IPv6
// set names, "" for a family without an address.
func (c *compiler) sets(ps peers, k string) [2]string {
	var r4, r6 []table.Range
	for _, p := range ps.pods {
		for _, ip := range p.IPs {
			if ip.Is4() {
				r4 = append(r4, table.Range{From: ip, To: ip})
			} else {
				r6 = append(r6, table.Range{From: ip, To: ip})
			}
		}
	}
	for _, b := range ps.blocks {
		if b.From.Is4() {
			r4 = append(r4, b)
		} else {
			r6 = append(r6, b)
		}
	}
	var names [2]string
	if len(r4) > 0 {
		names[0] = setName(false, k)
		c.rs.Sets[names[0]] = table.Set{Ranges: normalize(r4)}
	}
	if len(r6) > 0 {
		names[1] = setName(true, k)
		c.rs.Sets[names[1]] = table.Set{V6: true, Ranges: normalize(r6)}
	}
	return names
}
