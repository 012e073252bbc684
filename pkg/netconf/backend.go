package netconf

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/validate"
)

// Backend is the `backend` section: how pod traffic reaches other nodes.
type Backend struct {
	// Type is none (single node), vxlan, host-gw, auto or wireguard.
	Type string `json:"type"`
	// Underlay is the interface carrying node-to-node traffic; empty: the
	// interface of the default route.
	Underlay string `json:"underlay,omitempty"`
	VNI      int    `json:"vni,omitempty"`
	Port     int    `json:"port,omitempty"`
	// Nodes are static peers; the entry whose IP is on this node's
	// underlay is this node.
	Nodes    []StaticNode `json:"nodes,omitempty"`
	Registry *Registry    `json:"registry,omitempty"`
	// WireGuard configures type wireguard (defaults filled in by
	// ParseBackend; nil for the other types).
	WireGuard *WireGuard `json:"wireguard,omitempty"`
	// Encrypt asks that pod traffic between nodes be encrypted: type auto
	// then means wireguard (and never vxlan or host-gw, whatever happens
	// to the WireGuard device), and a type that sends it in the clear is
	// refused.
	Encrypt bool `json:"encrypt,omitempty"`
}

// StaticNode is one node of a static peer list.
type StaticNode struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
	// PodCIDR is the node's pod subnet; PodCIDRs lists more (dual stack).
	PodCIDR  string   `json:"podCIDR,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`

	// Parsed.
	Addr    net.IP       `json:"-"`
	Subnets []*net.IPNet `json:"-"`
}

// Registry is the datastore villaged keeps the node list in: etcd, or
// the Kubernetes API (Node objects).
type Registry struct {
	Type      string   `json:"type"`
	Endpoints []string `json:"endpoints,omitempty"`
	// Kubeconfig is the kubeconfig file of the kubernetes registry; ""
	// means the in-cluster configuration (the pod's service account).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Prefix     string `json:"prefix,omitempty"`
	CAFile     string `json:"caFile,omitempty"`
	CertFile   string `json:"certFile,omitempty"`
	KeyFile    string `json:"keyFile,omitempty"`
	// TTL of a node's registration lease, in seconds.
	TTL int `json:"ttl,omitempty"`
	// SubnetLen is the prefix length of the pod subnet villaged leases out
	// of clusterCIDR when the IPAM block names no range.
	SubnetLen int `json:"subnetLen,omitempty"`
	// ReclaimAfter is how long, in seconds, a node may be gone from the
	// registry before the surviving agents release its subnet lease and its
	// allocations in the shared LAN pool (0: DefaultReclaimAfter; -1: never).
	ReclaimAfter int `json:"reclaimAfter,omitempty"`
}

// Backend types the code tests for (the overlay's modes; the others are
// overlay.ModeVXLAN and overlay.ModeAuto).
const (
	BackendNone   = string(overlay.ModeNone)
	BackendHostGW = string(overlay.ModeHostGW)
)

// Registry types.
const (
	RegistryEtcd       = "etcd"
	RegistryKubernetes = "kubernetes"
)

// Registry defaults.
const (
	DefaultRegistryPrefix = "/village"
	DefaultRegistryTTL    = 60
	DefaultSubnetLen      = 24
	DefaultReclaimAfter   = 24 * 60 * 60
)

// Routes reports whether the backend carries pod traffic to other nodes
// (not nil, not "none").
func (b *Backend) Routes() bool { return b != nil && b.Type != BackendNone }

// ParseBackend validates a raw backend section; nil/empty means none.
func ParseBackend(raw json.RawMessage) (*Backend, error) {
	b := &Backend{Type: BackendNone}
	if len(raw) == 0 || string(raw) == "null" {
		return b, nil
	}
	if err := json.Unmarshal(raw, b); err != nil {
		return nil, Error("invalid \"backend\": %v", err)
	}
	if b.Type == "" {
		b.Type = BackendNone
	}
	if b.Underlay != "" {
		if err := validate.LinkName(b.Underlay); err != nil {
			return nil, Error("invalid \"backend.underlay\": %v", err)
		}
	}
	if err := b.parseEncrypt(); err != nil {
		return nil, err
	}
	if err := b.parseWireGuard(); err != nil {
		return nil, err
	}
	// Type, VNI and port: what the reconciler accepts (one set of limits).
	if err := b.OverlayConfig("").Validate(); err != nil {
		return nil, Error("invalid \"backend\" (type, vni, port): %v", err)
	}
	if err := b.parseNodes(); err != nil {
		return nil, err
	}
	if b.Registry != nil {
		if err := b.Registry.validate(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// parseEncrypt resolves "encrypt": auto becomes wireguard once and for
// all (the reconciler never sees auto, so it can never choose vxlan or
// host-gw), and the types that carry pod traffic in the clear are refused.
func (b *Backend) parseEncrypt() *types.Error {
	if !b.Encrypt {
		return nil
	}
	switch b.Type {
	case string(overlay.ModeAuto):
		b.Type = BackendWireGuard
	case BackendWireGuard, BackendNone:
	default:
		return Error("invalid \"backend.encrypt\": type %q carries pod traffic between nodes in the clear; use auto or wireguard", b.Type)
	}
	return nil
}

func (b *Backend) parseNodes() *types.Error {
	names := map[string]bool{}
	for i := range b.Nodes {
		n := &b.Nodes[i]
		field := fmt.Sprintf("backend.nodes[%d]", i)
		if n.Name == "" || len(n.Name) > 253 || strings.ContainsAny(n.Name, "/\x00 ") {
			return Error("invalid %q name %q: a node name (no '/', spaces or NUL)", field, n.Name)
		}
		if names[n.Name] {
			return Error("invalid %q: node %q is listed twice", field, n.Name)
		}
		names[n.Name] = true
		if n.Addr = net.ParseIP(n.IP); n.Addr == nil || strings.Contains(n.IP, "%") {
			return Error("invalid %q ip %q: an IPv4 or IPv6 address", field, n.IP)
		}
		cidrs := n.PodCIDRs
		if n.PodCIDR != "" {
			cidrs = append([]string{n.PodCIDR}, cidrs...)
		}
		if len(cidrs) == 0 {
			return Error("invalid %q: node %q has no \"podCIDR\"", field, n.Name)
		}
		n.Subnets = nil
		for _, c := range cidrs {
			ip, sn, err := net.ParseCIDR(c)
			if err != nil || !ip.Equal(sn.IP) {
				return Error("invalid %q podCIDR %q: a subnet like 10.244.2.0/24", field, c)
			}
			n.Subnets = append(n.Subnets, sn)
		}
	}
	return nil
}

func (r *Registry) validate() *types.Error {
	if r.Type == "" {
		r.Type = RegistryEtcd
	}
	switch r.Type {
	case RegistryKubernetes:
		if len(r.Endpoints) > 0 || r.CAFile != "" || r.CertFile != "" || r.KeyFile != "" {
			return Error("invalid \"backend.registry\": type kubernetes takes a \"kubeconfig\" (or none: in-cluster), not etcd endpoints or certificates")
		}
		return nil
	case RegistryEtcd:
		if r.Kubeconfig != "" {
			return Error("invalid \"backend.registry\": \"kubeconfig\" is for type kubernetes, not etcd")
		}
	default:
		return Error("invalid \"backend.registry.type\" %q: etcd or kubernetes", r.Type)
	}
	if len(r.Endpoints) == 0 {
		return Error("invalid \"backend.registry\": \"endpoints\" is empty")
	}
	for _, e := range r.Endpoints {
		if !ipamconfig.ValidEndpoint(e) {
			return Error("invalid \"backend.registry.endpoints\" entry %q: want http(s)://host:port", e)
		}
	}
	if r.Prefix == "" {
		r.Prefix = DefaultRegistryPrefix
	}
	if !strings.HasPrefix(r.Prefix, "/") || strings.Contains(r.Prefix, "..") {
		return Error("invalid \"backend.registry.prefix\" %q: an absolute key prefix like /village", r.Prefix)
	}
	if r.TTL == 0 {
		r.TTL = DefaultRegistryTTL
	}
	if r.TTL < 5 || r.TTL > 3600 {
		return Error("invalid \"backend.registry.ttl\" %d: 5-3600 seconds", r.TTL)
	}
	if r.SubnetLen == 0 {
		r.SubnetLen = DefaultSubnetLen
	}
	if r.SubnetLen < 8 || r.SubnetLen > 126 {
		return Error("invalid \"backend.registry.subnetLen\" %d", r.SubnetLen)
	}
	if r.ReclaimAfter == 0 {
		r.ReclaimAfter = DefaultReclaimAfter
	}
	if r.ReclaimAfter < -1 {
		return Error("invalid \"backend.registry.reclaimAfter\" %d: seconds (at least 1), or -1 for never", r.ReclaimAfter)
	}
	return nil
}
