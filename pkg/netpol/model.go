package netpol

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/pkg/netpol/table"
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
	Name     string      `json:"name"`
	Protocol table.Proto `json:"protocol"`
	Port     uint16      `json:"port"`
}

// Input is everything one network's compile reads.
type Input struct {
	Network string
	// Bridge is the network's bridge (table.Ruleset.Bridge).
	Bridge   string
	Policies []*networkingv1.NetworkPolicy
	// Pods are all the cluster's pods (peers are selected among them).
	Pods []*Pod
	// Namespaces are the namespaces' labels by name.
	Namespaces map[string]map[string]string
	// Local are the keys (namespace/name) of this node's pods on this
	// network: the pods whose traffic this node filters.
	Local map[string]bool
}
