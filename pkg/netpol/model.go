package netpol

import (
	"net/netip"
	"strconv"

	networkingv1 "k8s.io/api/networking/v1"
)

// Pod is what Compile needs of a pod: who it is, its labels and addresses,
// and its named container ports.
type Pod struct {
	Namespace string
	Name      string
	Labels    map[string]string
	IPs       []netip.Addr
	// Ports are the container ports that carry a name.
	Ports []NamedPort
	// HostNetwork pods share their node's addresses: never selectable.
	HostNetwork bool
	// LAN says the pod has Village's LAN interface (net1), which no
	// policy filters.
	LAN bool
}

// Key is namespace/name.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// NamedPort is a container port with a name.
type NamedPort struct {
	Name     string
	Protocol Proto
	Port     uint16
}

// Proto is an IP protocol number.
type Proto uint8

// The protocols NetworkPolicy names.
const (
	ProtoAny  Proto = 0
	ProtoTCP  Proto = 6
	ProtoUDP  Proto = 17
	ProtoSCTP Proto = 132
)

func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	case ProtoAny:
		return "any"
	}
	return "proto-" + strconv.Itoa(int(p))
}

// Input is everything one network's compile reads.
type Input struct {
	Network  string
	Policies []*networkingv1.NetworkPolicy
	// Pods are all the cluster's pods (peers are selected among them).
	Pods []*Pod
	// Namespaces are the namespaces' labels by name.
	Namespaces map[string]map[string]string
	// Local are the keys (namespace/name) of this node's pods on this
	// network: the pods whose traffic this node filters.
	Local map[string]bool
}

// Ruleset is the compiled table of one network.
type Ruleset struct {
	Network string
	// Pods are this node's pods isolated in at least one direction,
	// sorted by key.
	Pods []PodRules
	// Sets are the peer sets the pods' rules name, by name.
	Sets map[string]Set
	// Problems are what Compile could not enforce.
	Problems []Problem
	// Namespaces are the namespaces that hold at least one policy, sorted:
	// a new pod there may be isolated, so ADD marks it pending.
	Namespaces []string
	// Compiled are the addresses of every local pod Compile saw (isolated
	// or not): their pending marks can go.
	Compiled []netip.Addr
}

// PodRules are the chains of one local pod.
type PodRules struct {
	Key string
	IPs []netip.Addr
	// Ingress and Egress are nil when no policy of that type selects the
	// pod (everything allowed); a Chain with no clause allows nothing.
	Ingress *Chain
	Egress  *Chain
}

// Chain allows a packet when one clause matches, and drops it otherwise.
type Chain struct {
	Clauses []Clause
}

// Clause matches the peer (the source for ingress, the destination for
// egress) and the destination port.
type Clause struct {
	// AnyPeer matches every address; else Set4 and Set6 name the peer
	// sets of each family ("" for a family with no peer).
	AnyPeer    bool
	Set4, Set6 string
	// Proto ProtoAny matches every packet; with a protocol, PortFrom 0
	// matches every port, else the range PortFrom..PortTo.
	Proto            Proto
	PortFrom, PortTo uint16
}

// Set is a named interval set of addresses of one family.
type Set struct {
	V6     bool
	Ranges []Range
}

// Range is an inclusive address range.
type Range struct {
	From, To netip.Addr
}

// Problem is a part of a policy Village does not enforce.
type Problem struct {
	// Policy is namespace/name of the policy.
	Policy string
	// Reason says what is not enforced and why.
	Reason string
}

func (p Problem) String() string { return "NetworkPolicy " + p.Policy + ": " + p.Reason }
