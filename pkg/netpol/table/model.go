// Package table is the nftables side of Village's NetworkPolicy support:
// the declarative model pkg/netpol compiles policies into (Ruleset), the
// code that installs it over netlink, and the pending marks the CNI
// plugin's ADD sets. It links no Kubernetes client, so the plugin can use
// it.
package table

import (
	"net/netip"
	"strconv"
)

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

// Ruleset is the compiled table of one network.
type Ruleset struct {
	Network string
	// Bridge is the network's bridge: the pods' link-local traffic
	// bridged there is dropped (linkLocal); "" drops it on every bridge.
	Bridge string
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
