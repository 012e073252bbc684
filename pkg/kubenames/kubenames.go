// Package kubenames is every name Village owns in the Kubernetes API, in
// one place: the village.cni.io/ annotations and labels on Nodes, Pods,
// Namespaces and the IPAM store's Leases, the Event reasons the agent
// writes, the loadBalancerClass of Services on the LAN, and the name the
// agent writes under (Event component, field manager, user agent). These
// names are the user-facing contract, so a reader finds
// them all here and no other package spells the prefix. It is a leaf of
// constants with no import at all: the plugin, the IPAM store helper and
// the agent link it alike.
package kubenames

// Prefix starts every label and annotation key Village owns.
const Prefix = "village.cni.io/"

// Agent is the name villaged writes under: the Events' source component
// (and so their reportingController), the field manager of its patches,
// and its client's user agent.
const Agent = "villaged"

// A Node's annotations, written by its agent with the kubernetes registry
// (pkg/kuberegistry).
const (
	// AnnotationUnderlayIP is the node's underlay address (overlay
	// endpoint / next hop).
	AnnotationUnderlayIP = Prefix + "underlay-ip"
	// AnnotationVtepMAC is the MAC of its VTEP (vxlan).
	AnnotationVtepMAC = Prefix + "vtep-mac"
	// AnnotationWireGuardKey is its WireGuard public key (backend
	// wireguard; absent otherwise).
	AnnotationWireGuardKey = Prefix + "wireguard-key"
	// AnnotationWireGuardEndpoint is the address:port its peers send
	// WireGuard to, when it is configured ("backend.wireguard.endpoint");
	// absent: its underlay address at the network's port.
	AnnotationWireGuardEndpoint = Prefix + "wireguard-endpoint"
	// LabelWireGuardHub on a Node, with value "true", set by the admin:
	// the node relays WireGuard traffic between nodes that cannot reach
	// each other (each behind its own NAT).
	LabelWireGuardHub = Prefix + "wireguard-hub"
)

// The LAN pods contract ("macvlan.pods": "annotated"; pkg/lanpods).
const (
	// AnnotationLAN "true" on a Pod: it wants the LAN interface.
	AnnotationLAN = Prefix + "lan"
	// AnnotationLANIP on a Pod: exactly these LAN addresses (implies lan).
	AnnotationLANIP = Prefix + "lan-ip"
	// AnnotationLANAddress is written by the agent: "net1=192.168.50.210/24".
	// The NetworkPolicy controller reads it to leave that interface alone.
	AnnotationLANAddress = Prefix + "lan-address"
	// LabelLAN on a Namespace, with value LabelLANAllowed: its pods may ask.
	LabelLAN        = Prefix + "lan"
	LabelLANAllowed = "allowed"
)

// LoadBalancerClassLAN is the spec.loadBalancerClass of a Service Village
// gives an address on the LAN.
const LoadBalancerClassLAN = Prefix + "lan"

// The LAN Services contract ("macvlan.services"; pkg/lansvc/controller).
// A Service's namespace must carry LabelLAN=LabelLANAllowed, and
// AnnotationLANIP asks for exactly these addresses, as for pods.
const (
	// AnnotationLANShare on a Service: Services of one namespace with the
	// same key share one address, provided their ports do not clash.
	AnnotationLANShare = Prefix + "lan-share"
	// AnnotationLANAnnouncer is written by the agent: the node that
	// answers ARP/NDP for the Service's address.
	AnnotationLANAnnouncer = Prefix + "lan-announcer"
	// AnnotationLANMember is written by each agent on its own Node: its
	// LAN address and gossip port ("192.168.50.11:7947"), which the other
	// agents join.
	AnnotationLANMember = Prefix + "lan-member"
	// AnnotationLANMAC is written by each agent on its own Node: the MAC
	// of its LAN interface. The other agents' announcers take a frame
	// from it for a hand-back between nodes of the cluster, never for a
	// conflict; only the API server's word counts, never the gossip's.
	AnnotationLANMAC = Prefix + "lan-mac"
	// LabelExcludeFromLB is the well-known Node label that keeps a node
	// from announcing with externalTrafficPolicy Cluster (Kubernetes' own
	// name, not Village's).
	LabelExcludeFromLB = "node.kubernetes.io/exclude-from-external-load-balancers"
)

// The Event reasons the agent writes (all Warnings).
const (
	// On a Pod, why it got no LAN address.
	ReasonLANForbidden   = "LANForbidden"
	ReasonLANInvalid     = "LANRequestInvalid"
	ReasonLANOutsidePool = "LANAddressOutsidePool"
	ReasonLANTaken       = "LANAddressTaken"
	ReasonLANExhausted   = "LANPoolExhausted"
	ReasonLANFailed      = "LANFailed"
	// On a NetworkPolicy, a part this node cannot enforce.
	ReasonPolicyNotEnforced = "NetworkPolicyNotEnforced"
	// On a LoadBalancer Service, also: LANForbidden (its namespace may
	// not), LANRequestInvalid, LANAddressOutsidePool, LANAddressTaken,
	// LANPoolExhausted, and its lan-share ports clash with another's.
	ReasonLANPortsClash = "LANPortsClash"
	// On a Node, kube-proxy in IPVS mode without strictARP: the node
	// answers ARP for every Service address itself.
	ReasonLANIPVSNoStrictARP = "LANIPVSWithoutStrictARP"
)

// The Normal Events on a LAN Service.
const (
	// ReasonLANAssigned: the Service got its LAN address(es).
	ReasonLANAssigned = "LANAddressAssigned"
	// ReasonLANAnnounced: this node now answers for the address.
	ReasonLANAnnounced = "LANAnnounced"
	// ReasonLANAddressInUse (Warning): the node elected for the address
	// found another MAC answering for it (another cluster with an
	// overlapping range, a host that took it) and does not answer.
	ReasonLANAddressInUse = "LANAddressInUse"
)

// The labels and annotations of the kubernetes IPAM store's Leases
// (pkg/ipam/store/kube; the label values are hashes, the annotations say
// the same in clear).
const (
	LabelIPAMNetwork        = Prefix + "ipam-network"
	LabelIPAMOwner          = Prefix + "ipam-owner"
	LabelIPAMNode           = Prefix + "ipam-node"
	LabelIPAMKind           = Prefix + "ipam-kind"
	AnnotationIPAMIP        = Prefix + "ipam-ip"
	AnnotationIPAMNetwork   = Prefix + "ipam-network"
	AnnotationIPAMContainer = Prefix + "ipam-container-id"
	AnnotationIPAMIfName    = Prefix + "ipam-ifname"
	AnnotationIPAMNode      = Prefix + "ipam-node"
)
