// Package registry is Village's node registry and pod subnet lease table in
// etcd, the shared state `villaged run` keeps so that every node knows every
// other node's underlay address, pod subnets and VTEP MAC.
//
// # Keys
//
//	<prefix>/nodes/<network>/<name>     {"name","ip","podCIDRs","vtepMAC"}   under the node's lease
//	<prefix>/subnets/<network>/<cidr>   "<name>"                              no lease
//	<prefix>/departed/<network>/<name>  "<time first seen gone>"              no lease (see reclaim.go)
//
// A node record lives under an etcd lease of the configured TTL that the
// node's agent keeps alive; when the agent dies the lease expires, etcd
// deletes the record, and every other agent's watch sees the deletion and
// removes the routes. A subnet lease is NOT under the node lease: a node
// keeps its pod subnet across restarts and crashes (pods still have addresses
// from it), and the first thing [Registry.LeaseSubnet] does is look for the
// subnet the node already holds. A new subnet is taken with a transaction
// whose only condition is that the key was never created (CreateRevision
// == 0), so two nodes never hold the same subnet whatever the interleaving.
//
// # Watching
//
// [Registry.Follow] lists the nodes at one revision, then watches from the
// next revision, so no change between the list and the watch is lost. It
// hands the list, then each change, to a [Feed], which gives its reader the
// whole list once and after that only the records that changed, coalesced
// while the reader is busy. A compacted or failed watch starts over with a
// new list (a full batch again).
//
// Every call to etcd is bounded by Config.Timeout (the watch stream itself
// excepted: it is bounded by the caller's context), and every error names the
// endpoints and what was being done (see etcdclient.Config.Describe).
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/etcdclient"
	"github.com/village-cni/village/pkg/validate"
)

// DefaultTimeout bounds one etcd operation when Config.Timeout is 0.
const DefaultTimeout = 5 * time.Second

// Config says where in etcd a network's registry lives.
type Config struct {
	// Etcd is how the client was made; its endpoints name errors.
	Etcd etcdclient.Config
	// Prefix is the key prefix, such as "/village".
	Prefix string
	// Network is the CNI network name.
	Network string
	// TTL of a node record's lease.
	TTL time.Duration
	// Timeout bounds each etcd operation (DefaultTimeout when 0).
	Timeout time.Duration
}

// Node is one node's record.
type Node struct {
	Name     string   `json:"name"`
	IP       string   `json:"ip"`
	PodCIDRs []string `json:"podCIDRs"`
	VtepMAC  string   `json:"vtepMAC,omitempty"`
	// WireGuardKey is the node's WireGuard public key (base64) under the
	// wireguard backend; WireGuardEndpoint the address:port it asks its
	// peers to send to, "" for its IP at the network's port.
	WireGuardKey      string `json:"wireguardKey,omitempty"`
	WireGuardEndpoint string `json:"wireguardEndpoint,omitempty"`
	// Hub: the node relays WireGuard traffic between nodes that cannot
	// reach each other. The kubernetes registry reads it from a Node
	// label the admin sets; the etcd record does not hold it (the config's
	// backend.wireguard.hubs names hubs there).
	Hub bool `json:"-"`
}

// Validate checks that the record can be used: a name that is one key
// component, an IP address, pod subnets and a MAC when one is given.
func (n Node) Validate() error {
	if err := validate.NodeName(n.Name); err != nil {
		return err
	}
	if net.ParseIP(n.IP) == nil {
		return fmt.Errorf("node %q: ip %q is not an IP address", n.Name, n.IP)
	}
	for _, c := range n.PodCIDRs {
		if _, _, err := net.ParseCIDR(c); err != nil {
			return fmt.Errorf("node %q: podCIDR %q: %w", n.Name, c, err)
		}
	}
	if n.VtepMAC != "" {
		if _, err := validate.MAC(n.VtepMAC); err != nil {
			return fmt.Errorf("node %q: vtepMAC %q: %w", n.Name, n.VtepMAC, err)
		}
	}
	if n.WireGuardKey != "" {
		if _, err := wgtypes.ParseKey(n.WireGuardKey); err != nil {
			return fmt.Errorf("node %q: wireguardKey %q: %w", n.Name, n.WireGuardKey, err)
		}
	}
	if n.WireGuardEndpoint != "" {
		if _, err := netip.ParseAddrPort(n.WireGuardEndpoint); err != nil {
			return fmt.Errorf("node %q: wireguardEndpoint %q: %w", n.Name, n.WireGuardEndpoint, err)
		}
	}
	return nil
}

// Equal reports whether two records say the same.
func (n Node) Equal(o Node) bool {
	return n.Name == o.Name && n.IP == o.IP && n.VtepMAC == o.VtepMAC && slices.Equal(n.PodCIDRs, o.PodCIDRs) &&
		n.WireGuardKey == o.WireGuardKey && n.WireGuardEndpoint == o.WireGuardEndpoint && n.Hub == o.Hub
}

// Registry reads and writes one network's node records and subnet leases.
// It holds no state besides its configuration and is safe for concurrent use.
type Registry struct {
	cli *clientv3.Client
	cfg Config
}

// New returns the registry of cfg.Network on cli. The caller closes cli.
func New(cli *clientv3.Client, cfg Config) (*Registry, error) {
	if cfg.Prefix == "" || !strings.HasPrefix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("registry prefix %q: want an absolute key prefix like /village", cfg.Prefix)
	}
	cfg.Prefix = strings.TrimRight(cfg.Prefix, "/")
	if cfg.Network == "" || strings.Contains(cfg.Network, "/") {
		return nil, fmt.Errorf("registry network name %q: want one key component", cfg.Network)
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("registry lease TTL %s: want at least 1s", cfg.TTL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Registry{cli: cli, cfg: cfg}, nil
}

// Config returns the configuration with defaults filled in.
func (r *Registry) Config() Config { return r.cfg }

// Client is the etcd client the registry uses.
func (r *Registry) Client() *clientv3.Client { return r.cli }

// NodesPrefix is the key prefix of the node records (with a trailing '/').
func (r *Registry) NodesPrefix() string {
	return r.cfg.Prefix + "/nodes/" + r.cfg.Network + "/"
}

// SubnetsPrefix is the key prefix of the subnet leases (with a trailing '/').
func (r *Registry) SubnetsPrefix() string {
	return r.cfg.Prefix + "/subnets/" + r.cfg.Network + "/"
}

func (r *Registry) nodeKey(name string) string { return r.NodesPrefix() + name }

// op runs f with a context bounded by the configured timeout and describes
// its error (naming the endpoints and what).
func (r *Registry) op(ctx context.Context, what string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	return r.cfg.Etcd.Describe(r.cfg.Timeout, what, f(ctx))
}

// Nodes lists every node record and the revision it was read at. Records
// that do not decode are skipped and returned joined in bad (they never
// hide the good ones).
func (r *Registry) Nodes(ctx context.Context) (nodes []Node, rev int64, bad error, err error) {
	var resp *clientv3.GetResponse
	err = r.op(ctx, "listing "+r.NodesPrefix(), func(ctx context.Context) error {
		var err error
		resp, err = r.cli.Get(ctx, r.NodesPrefix(), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, 0, nil, err
	}
	var errs []error
	for _, kv := range resp.Kvs {
		n, err := r.decode(kv.Key, kv.Value)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		nodes = append(nodes, n)
	}
	sortNodes(nodes)
	return nodes, resp.Header.Revision, errors.Join(errs...), nil
}

// Node reads one node's record; found is false when there is none.
func (r *Registry) Node(ctx context.Context, name string) (n Node, found bool, err error) {
	var resp *clientv3.GetResponse
	err = r.op(ctx, "reading "+r.nodeKey(name), func(ctx context.Context) error {
		var err error
		resp, err = r.cli.Get(ctx, r.nodeKey(name))
		return err
	})
	if err != nil || len(resp.Kvs) == 0 {
		return Node{}, false, err
	}
	n, err = r.decode(resp.Kvs[0].Key, resp.Kvs[0].Value)
	return n, err == nil, err
}

func (r *Registry) decode(key, value []byte) (Node, error) {
	name := strings.TrimPrefix(string(key), r.NodesPrefix())
	var n Node
	if err := json.Unmarshal(value, &n); err != nil {
		return n, fmt.Errorf("node record %s: %w", key, err)
	}
	if n.Name != name {
		return n, fmt.Errorf("node record %s names node %q", key, n.Name)
	}
	if err := n.Validate(); err != nil {
		return n, fmt.Errorf("node record %s: %w", key, err)
	}
	return n, nil
}

func sortNodes(nodes []Node) {
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
}
