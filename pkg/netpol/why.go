package netpol

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/pkg/netpol/table"
)

// Model is what a compile decided, kept per pod and rule with where each
// rule comes from, so that Explain can say which policy and rule allow or
// deny a connection without the API server (`villaged why`). BuildModel
// makes it with the compiler itself, so it selects exactly what Compile
// does.
type Model struct {
	Network string `json:"network"`
	// Pods are the pods the compile knew that have an address, sorted by
	// key: this node's and the other nodes' (their policies decide the
	// other end of a connection).
	Pods []ModelPod `json:"pods"`
	// Sets are the peer addresses the rules name, by set name.
	Sets map[string][]table.Range `json:"sets"`
}

// ModelPod is one pod of a Model.
type ModelPod struct {
	// Pod is namespace/name.
	Pod string       `json:"pod"`
	IPs []netip.Addr `json:"ips"`
	// Local says the pod is on this node: this node filters its traffic.
	Local bool `json:"local,omitempty"`
	// HostNetwork pods have their node's addresses and no policy.
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// Ports are the pod's named container ports: a policy's named port
	// is resolved against them (Explain says what it resolved to).
	Ports []NamedPort `json:"ports,omitempty"`
	// Ingress and Egress are nil when no policy isolates the pod in that
	// direction (everything is allowed).
	Ingress *Isolation `json:"ingress,omitempty"`
	Egress  *Isolation `json:"egress,omitempty"`
}

// Isolation is one direction of an isolated pod: the policies that
// isolate it and the rules that allow traffic (none: nothing is allowed).
type Isolation struct {
	Policies []string    `json:"policies"`
	Rules    []ModelRule `json:"rules"`
	// Named are the rules of a named port, one per peer, whatever the
	// name resolves to (PortFrom 0): Explain says why such a rule does
	// not admit a peer it names (the destination has no port of that
	// name, or it has another number).
	Named []ModelRule `json:"named,omitempty"`
}

// ModelRule allows the peers it names on its ports.
type ModelRule struct {
	// Policy is namespace/name of the policy.
	Policy string `json:"policy"`
	// Where is the rule's place in the policy: spec.ingress[0].from[1]
	// for one peer, spec.ingress[0] for a rule without peers (every peer).
	Where string `json:"where"`
	// AnyPeer matches every address; else Sets name the peer sets.
	AnyPeer bool     `json:"anyPeer,omitempty"`
	Sets    []string `json:"sets,omitempty"`
	// Proto ProtoAny (0) matches every packet; with a protocol, PortFrom
	// 0 matches every port, else PortFrom..PortTo (a named port resolved
	// as the compile resolves it).
	Proto    table.Proto `json:"proto"`
	PortFrom uint16      `json:"portFrom,omitempty"`
	PortTo   uint16      `json:"portTo,omitempty"`
	// PortName is the name the policy gave the port ("" for a number).
	PortName string `json:"portName,omitempty"`
}

// BuildModel models in the way Compile compiles it, for every pod of the
// cluster with an address (this node's are marked Local).
func BuildModel(in Input) *Model {
	c := &compiler{in: in, rs: &table.Ruleset{Network: in.Network, Sets: map[string]table.Set{}}, seen: map[table.Problem]bool{}}
	c.index()
	m := &Model{Network: in.Network, Pods: []ModelPod{}, Sets: map[string][]table.Range{}}
	for _, p := range c.pods {
		if len(p.IPs) == 0 {
			continue
		}
		mp := ModelPod{Pod: p.Key(), IPs: slices.Clone(p.IPs), Local: in.Local[p.Key()], HostNetwork: p.HostNetwork, Ports: slices.Clone(p.Ports)}
		slices.SortFunc(mp.IPs, netip.Addr.Compare)
		if !p.HostNetwork { // never selected (Compile reports it)
			for _, pol := range c.selecting(p) {
				in, eg := c.types(pol)
				if in {
					mp.Ingress = c.isolation(mp.Ingress, pol, p, false)
				}
				if eg {
					mp.Egress = c.isolation(mp.Egress, pol, p, true)
				}
			}
		}
		m.Pods = append(m.Pods, mp)
	}
	for name, s := range c.rs.Sets {
		m.Sets[name] = s.Ranges
	}
	return m
}

// isolation adds pol's rules of one direction for pod p to iso (made when
// nil). Each peer of a rule is compiled on its own, under an origin of its
// own, so that a rule of the Model names the peer that admits.
func (c *compiler) isolation(iso *Isolation, pol *networkingv1.NetworkPolicy, p *Pod, egress bool) *Isolation {
	if iso == nil {
		iso = &Isolation{Policies: []string{}, Rules: []ModelRule{}}
	}
	iso.Policies = append(iso.Policies, key(pol))
	dir := map[bool]string{false: "ingress", true: "egress"}[egress]
	field := map[bool]string{false: "from", true: "to"}[egress]
	add := func(i int, where string, list []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
		origin := fmt.Sprintf("%s|%s|%d|model|%s", key(pol), dir, i, where)
		// one port at a time (a rule's clauses are its ports'), to
		// know the name of a named one
		each := [][]networkingv1.NetworkPolicyPort{nil}
		if len(ports) > 0 {
			each = nil
			for j := range ports {
				each = append(each, ports[j:j+1])
			}
		}
		for _, one := range each {
			name := ""
			if len(one) == 1 && one[0].Port != nil && one[0].Port.Type == intstr.String {
				name = one[0].Port.StrVal
				if proto, ok := protoOf(one[0]); ok && one[0].EndPort == nil {
					// the peers it names, the port left to resolve
					for _, cl := range c.clause(c.peers(pol, origin, list), origin, "named", table.Clause{Proto: proto}) {
						iso.Named = append(iso.Named, ModelRule{Policy: key(pol), Where: where, AnyPeer: cl.AnyPeer, Sets: sets(cl), Proto: proto, PortName: name})
					}
				}
			}
			for _, cl := range c.ruleOf(pol, p, egress, i, origin, list, one) {
				iso.Rules = append(iso.Rules, ModelRule{Policy: key(pol), Where: where, AnyPeer: cl.AnyPeer, Sets: sets(cl), Proto: cl.Proto, PortFrom: cl.PortFrom, PortTo: cl.PortTo, PortName: name})
			}
		}
	}
	type rule struct {
		peers []networkingv1.NetworkPolicyPeer
		ports []networkingv1.NetworkPolicyPort
	}
	var rules []rule
	if egress {
		for _, r := range pol.Spec.Egress {
			rules = append(rules, rule{r.To, r.Ports})
		}
	} else {
		for _, r := range pol.Spec.Ingress {
			rules = append(rules, rule{r.From, r.Ports})
		}
	}
	for i, r := range rules {
		where := fmt.Sprintf("spec.%s[%d]", dir, i)
		if len(r.peers) == 0 {
			add(i, where, nil, r.ports)
			continue
		}
		for k := range r.peers {
			add(i, fmt.Sprintf("%s.%s[%d]", where, field, k), r.peers[k:k+1], r.ports)
		}
	}
	return iso
}

// sets are the peer set names of cl.
func sets(cl table.Clause) []string {
	var out []string
	for _, s := range []string{cl.Set4, cl.Set6} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Endpoint is one end of a connection Explain is asked about.
type Endpoint struct {
	// Pod is namespace/name; "" when IP is given.
	Pod string
	// IP is the address; with Pod, the pod's address of this family is
	// used (the invalid Addr: whichever family the other end has).
	IP netip.Addr
	// Node says IP is one of this node's own addresses.
	Node bool
}

// Verdict is Explain's answer.
type Verdict struct {
	Allowed bool `json:"allowed"`
	// From and To say who the ends are: namespace/name (address), or the
	// address.
	From string `json:"from"`
	To   string `json:"to"`
	// Port 0 asks about any port and protocol.
	Port  uint16      `json:"port,omitempty"`
	Proto table.Proto `json:"proto,omitempty"`
	// Egress is the source's side, Ingress the destination's.
	Egress  Side `json:"egress"`
	Ingress Side `json:"ingress"`
	// Ports are, with Port 0, the ports both sides allow ("" for all).
	Ports []string `json:"ports,omitempty"`
	// Summary is the one-line verdict.
	Summary string `json:"summary"`
}

// Side is what one direction of a connection says.
type Side struct {
	// Pod is the pod whose policies decide ("" when the end is not a pod
	// of the cluster, or is the node).
	Pod string `json:"pod,omitempty"`
	// Here says this node enforces this side; else the pod's own node
	// does (or nothing does).
	Here     bool     `json:"here"`
	Isolated bool     `json:"isolated"`
	Policies []string `json:"policies,omitempty"`
	Allowed  bool     `json:"allowed"`
	// By are the rules that allow (the first decides; with Port 0, every
	// rule that admits the peer).
	By     []ModelRule `json:"by,omitempty"`
	Reason string      `json:"reason"`
}

// Explain says whether a connection from from to to on port/proto (port 0:
// any port) is allowed by the policies m was built from, as Kubernetes
// defines it: the source's egress and the destination's ingress must each
// allow it; a pod no policy isolates in a direction allows everything
// there; traffic between the node and its own pods is always allowed.
func Explain(m *Model, from, to Endpoint, port uint16, proto table.Proto) (Verdict, error) {
	src, dst, err := m.resolve(from, to)
	if err != nil {
		return Verdict{}, err
	}
	v := Verdict{From: src.String(), To: dst.String(), Port: port, Proto: proto}
	if port != 0 && proto == table.ProtoAny {
		return v, fmt.Errorf("port %d without a protocol", port)
	}
	if port == 0 {
		v.Proto = table.ProtoAny
	}
	v.Egress = m.side(src, dst, true, port, proto)
	v.Ingress = m.side(dst, src, false, port, proto)
	v.Allowed = v.Egress.Allowed && v.Ingress.Allowed
	what := "port " + portProto(port, proto)
	if port == 0 {
		what = "any port"
		if v.Allowed {
			v.Ports = intersect(admitted(v.Egress), admitted(v.Ingress))
			v.Allowed = len(v.Ports) > 0
		}
	}
	verdict := "denied"
	if v.Allowed {
		verdict = "allowed"
	}
	v.Summary = fmt.Sprintf("%s: %s -> %s %s", verdict, v.From, v.To, what)
	if port == 0 && v.Allowed {
		v.Summary += " (on " + strings.Join(v.Ports, ", ") + ")"
	}
	if port == 0 && !v.Allowed && v.Egress.Allowed && v.Ingress.Allowed {
		v.Summary += " (the ports egress allows and those ingress allows do not meet)"
	}
	return v, nil
}

// end is a resolved endpoint.
type end struct {
	ip   netip.Addr
	pod  *ModelPod // nil: not a pod of the cluster
	node bool      // one of this node's addresses, or a local hostNetwork pod
}

func (e end) String() string {
	if e.pod != nil {
		return fmt.Sprintf("%s (%s)", e.pod.Pod, e.ip)
	}
	if e.node {
		return fmt.Sprintf("%s (this node)", e.ip)
	}
	return e.ip.String()
}

// resolve finds the pods and the addresses of one family for both ends.
func (m *Model) resolve(from, to Endpoint) (end, end, error) {
	a, err := m.lookup(from)
	if err != nil {
		return end{}, end{}, err
	}
	b, err := m.lookup(to)
	if err != nil {
		return end{}, end{}, err
	}
	pick := func(e *end, v4 bool) bool {
		if e.ip.IsValid() {
			return e.ip.Is4() == v4
		}
		for _, ip := range e.pod.IPs {
			if ip.Is4() == v4 {
				e.ip = ip
				return true
			}
		}
		return false
	}
	for _, v4 := range []bool{true, false} {
		x, y := a, b
		if pick(&x, v4) && pick(&y, v4) {
			return x, y, nil
		}
	}
	return end{}, end{}, fmt.Errorf("%s and %s have no address of the same family", describe(from, a), describe(to, b))
}

func describe(ep Endpoint, e end) string {
	switch {
	case e.pod != nil:
		return fmt.Sprintf("pod %s %v", ep.Pod, e.pod.IPs)
	case ep.Pod != "":
		return fmt.Sprintf("pod %s (%s)", ep.Pod, e.ip)
	}
	return e.ip.String()
}

// lookup finds ep's pod: by name, or the pod that has ep's address.
func (m *Model) lookup(ep Endpoint) (end, error) {
	if ep.Pod == "" {
		ip := ep.IP.Unmap()
		if !ip.IsValid() {
			return end{}, fmt.Errorf("an endpoint needs a pod or an address")
		}
		e := end{ip: ip, node: ep.Node}
		for i := range m.Pods {
			p := &m.Pods[i]
			if slices.Contains(p.IPs, ip) && !p.HostNetwork {
				e.pod = p
				break
			}
			if slices.Contains(p.IPs, ip) && p.HostNetwork && p.Local {
				e.node = true
			}
		}
		return e, nil
	}
	i, ok := slices.BinarySearchFunc(m.Pods, ep.Pod, func(p ModelPod, k string) int { return strings.Compare(p.Pod, k) })
	if !ok {
		return end{}, fmt.Errorf("pod %s: not known to the policy controller of network %s (no such pod, or it has no address yet)", ep.Pod, m.Network)
	}
	p := &m.Pods[i]
	if p.HostNetwork {
		// its addresses are its node's: as the node's own for this node
		e := end{ip: ep.IP.Unmap(), node: p.Local}
		if !e.ip.IsValid() {
			e.ip = p.IPs[0]
		}
		return e, nil
	}
	e := end{ip: ep.IP.Unmap(), pod: p}
	if e.ip.IsValid() && !slices.Contains(p.IPs, e.ip) {
		return end{}, fmt.Errorf("pod %s has no address %s (it has %v)", ep.Pod, e.ip, p.IPs)
	}
	return e, nil
}

// side decides one direction: self's egress to peer (egress) or self's
// ingress from peer.
func (m *Model) side(self, peer end, egress bool, port uint16, proto table.Proto) Side {
	dir := map[bool]string{false: "ingress", true: "egress"}[egress]
	s := Side{Allowed: true}
	// Between the node and its own pods nothing is forwarded: no hook
	// of the policy table sees it (doc.go).
	if (self.node && peer.pod != nil && peer.pod.Local) || (peer.node && self.pod != nil && self.pod.Local) {
		s.Here = true
		s.Reason = "traffic between this node and its own pods is always allowed"
		return s
	}
	if self.pod == nil {
		if self.node {
			s.Reason = fmt.Sprintf("%s is this node's own address: no policy applies to its %s", self.ip, dir)
		} else {
			s.Reason = fmt.Sprintf("%s is not a pod's address: no policy applies to its %s", self.ip, dir)
		}
		return s
	}
	p := self.pod
	s.Pod, s.Here = p.Pod, p.Local
	iso := p.Ingress
	if egress {
		iso = p.Egress
	}
	if iso == nil {
		s.Reason = fmt.Sprintf("pod %s is not isolated for %s: no NetworkPolicy selects it for %s", p.Pod, dir, dir)
		return s.at()
	}
	s.Isolated, s.Policies = true, iso.Policies
	for _, r := range iso.Rules {
		if m.admits(r, peer.ip, port, proto) {
			s.By = append(s.By, r)
			if port != 0 {
				break
			}
		}
	}
	// the destination, whose container ports a named port is
	dst := self
	if egress {
		dst = peer
	}
	if len(s.By) > 0 {
		s.Reason = "allowed by " + s.By[0].of(dst)
		for _, r := range s.By[1:] {
			s.Reason += ", " + r.of(dst)
		}
		return s.at()
	}
	s.Allowed = false
	what := "to " + portProto(port, proto)
	if port == 0 {
		what = "on any port"
	}
	s.Reason = fmt.Sprintf("denied: pod %s is isolated for %s by %s and no rule admits %s %s", p.Pod, dir, strings.Join(iso.Policies, ", "), peer.ip, what)
	if port != 0 {
		for _, r := range iso.Named {
			if r.Proto == proto && m.admits(r, peer.ip, 0, table.ProtoAny) {
				s.Reason += "; " + r.unresolved(dst, port)
			}
		}
	}
	return s.at()
}

// of is r as a reason names it, a named port with the pod it is of.
func (r ModelRule) of(dst end) string {
	if r.PortName != "" && dst.pod != nil {
		return fmt.Sprintf("%s %s %s (named port %q of pod %s)", r.Policy, r.Where, r.ports(), r.PortName, dst.pod.Pod)
	}
	return r.String()
}

// unresolved says why named-port rule r (of the Named list, which names
// the peer) does not admit port on dst: the name is resolved against
// dst's container ports as the compile resolves it.
func (r ModelRule) unresolved(dst end, port uint16) string {
	at := fmt.Sprintf("%s %s names port %q", r.Policy, r.Where, r.PortName)
	if dst.pod == nil {
		return fmt.Sprintf("%s, but %s is not a pod: only a pod's container ports have names", at, dst.ip)
	}
	n, ok := resolve(dst.pod.Ports, r.PortName, r.Proto)
	if !ok {
		return fmt.Sprintf("%s, which pod %s does not have (no %s container port of that name): the rule admits nothing there", at, dst.pod.Pod, strings.ToUpper(r.Proto.String()))
	}
	return fmt.Sprintf("%s, which is %s on pod %s, not %d", at, portProto(n, r.Proto), dst.pod.Pod, port)
}

// at says who enforces a pod's side when it is not this node.
func (s Side) at() Side {
	if !s.Here {
		s.Reason += " (enforced on the pod's own node)"
	}
	return s
}

// admits says whether r matches peer on port/proto (port 0: any).
func (m *Model) admits(r ModelRule, peer netip.Addr, port uint16, proto table.Proto) bool {
	if port != 0 {
		if r.Proto != table.ProtoAny && (r.Proto != proto || (r.PortFrom != 0 && (port < r.PortFrom || port > r.PortTo))) {
			return false
		}
	}
	if r.AnyPeer {
		return true
	}
	for _, name := range r.Sets {
		for _, rg := range m.Sets[name] {
			if rg.From.Is4() == peer.Is4() && !peer.Less(rg.From) && !rg.To.Less(peer) {
				return true
			}
		}
	}
	return false
}

// String is the rule as a reason names it: the policy, the place and the
// ports.
func (r ModelRule) String() string {
	s := fmt.Sprintf("%s %s %s", r.Policy, r.Where, r.ports())
	if r.PortName != "" {
		s += fmt.Sprintf(" (named port %q)", r.PortName)
	}
	return s
}

func (r ModelRule) ports() string {
	switch {
	case r.Proto == table.ProtoAny:
		return "all ports"
	case r.PortFrom == 0:
		return "all " + strings.ToUpper(r.Proto.String()) + " ports"
	case r.PortFrom == r.PortTo:
		return "port " + portProto(r.PortFrom, r.Proto)
	}
	return fmt.Sprintf("ports %d-%d/%s", r.PortFrom, r.PortTo, strings.ToUpper(r.Proto.String()))
}

func portProto(port uint16, proto table.Proto) string {
	return fmt.Sprintf("%d/%s", port, strings.ToUpper(proto.String()))
}

// portSpan is a protocol and a port range: Proto ProtoAny is every
// packet, From 0 every port of Proto.
type portSpan struct {
	proto    table.Proto
	from, to uint16
}

// admitted are the port spans a side allows its peer (everything when
// it is not isolated).
func admitted(s Side) []portSpan {
	if !s.Isolated {
		return []portSpan{{}}
	}
	var out []portSpan
	for _, r := range s.By {
		out = append(out, portSpan{r.Proto, r.PortFrom, r.PortTo})
	}
	return out
}

// intersect are the spans both a and b allow, as sorted text.
func intersect(a, b []portSpan) []string {
	seen := map[string]bool{}
	for _, p := range a {
		for _, q := range b {
			x, y := p, q
			if x.proto == table.ProtoAny {
				x, y = y, x
			}
			if y.proto != table.ProtoAny && y.proto != x.proto {
				continue
			}
			if y.proto != table.ProtoAny && y.from != 0 {
				if x.from == 0 {
					x.from, x.to = y.from, y.to
				} else {
					x.from, x.to = max(x.from, y.from), min(x.to, y.to)
					if x.from > x.to {
						continue
					}
				}
			}
			seen[ModelRule{Proto: x.proto, PortFrom: x.from, PortTo: x.to}.ports()] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
