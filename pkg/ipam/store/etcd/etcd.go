// Package etcd is village-ipam's cluster-wide store: the allocations of a
// network live in etcd, so several nodes can share one address pool (a LAN
// range for macvlan pods) without an address ever being handed out twice.
//
// Key layout, under <prefix>/ipam/<network>/ (prefix "/village" by default):
//
//	ips/<ip>                          {"containerID","ifName","node","time"}: the allocation (the truth)
//	owners/<containerID>/<ifName>/<ip> ""  : owner index, so ADD and DEL read only their own keys
//	last/<rangeSet>                   "<ip>": round-robin marker of range set N, shared by all nodes
//
// Every mutation is one transaction: Claim is
// If(CreateRevision(ips/<ip>) == 0) Then(Put ips/<ip>, Put owners/..., Put last/N),
// so of any number of claimers of one address, on any nodes, exactly one
// succeeds; Release and GC delete ips/<ip> and its index key only
// If(ModRevision(ips/<ip>) == the revision whose owner they checked). The owner
// index is written and removed in the same transactions as the allocation, so
// it never disagrees with it. Lock is therefore a no-op.
//
// The round-robin marker is shared by the nodes of a network (rather than one
// per node) so that an address released anywhere is reused as late as
// possible cluster-wide (LAN neighbours' ARP caches, conntrack and DNS may
// still point at its previous holder), and so that nodes allocating at the
// same time spread over the range instead of racing for the same addresses.
// It is a hint: a lost update only moves where the next search starts.
//
// Each allocation records the node that made it; GC from a node releases only
// that node's allocations, because the runtime's list of valid attachments
// knows nothing of other nodes' pods.
//
// Every call is bounded (OpTimeout), so an unreachable etcd fails the CNI call
// with an error naming the endpoints instead of hanging it.
package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/village-cni/village/pkg/etcdclient"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/validate"
)

// DefaultOpTimeout bounds each store operation when Options.OpTimeout is 0.
const DefaultOpTimeout = 5 * time.Second

// Options configure a Store.
type Options struct {
	// Endpoints, CAFile, CertFile and KeyFile are ipam.store's keys of the
	// same names (see etcdclient.Config).
	Endpoints                 []string
	CAFile, CertFile, KeyFile string
	// Prefix is the root of Village's keys (store.DefaultEtcdPrefix when
	// empty): clusters sharing one etcd use different prefixes.
	Prefix string
	// Network is the CNI network name; networks never see each other's
	// allocations.
	Network string
	// NodeName is recorded with each allocation and scopes GC; empty means
	// the name villaged published for Network (nodelocal.NodeName), so the
	// allocations carry the name the agent registers and reclaims under.
	NodeName string
	// DialTimeout bounds connecting (etcdclient.DefaultDialTimeout when 0);
	// OpTimeout bounds each operation (DefaultOpTimeout when 0).
	DialTimeout, OpTimeout time.Duration
}

// Store is the etcd store of one network. It is safe for concurrent use.
type Store struct {
	cli     *clientv3.Client
	cfg     etcdclient.Config
	base    string // <prefix>/ipam/<network>/
	node    string
	timeout time.Duration
}

var _ store.Store = (*Store)(nil)

// record is the value of ips/<ip>.
type record struct {
	ContainerID string    `json:"containerID"`
	IfName      string    `json:"ifName"`
	Node        string    `json:"node"`
	Time        time.Time `json:"time"`
}

// New validates opts and makes the client. It does not contact etcd: the
// first operation does, within its timeout. Close the store when done.
func New(opts Options) (*Store, error) {
	if err := validate.NetworkName(opts.Network); err != nil {
		return nil, fmt.Errorf("etcd store: %w", err)
	}
	prefix, err := CleanPrefix(opts.Prefix)
	if err != nil {
		return nil, err
	}
	node := opts.NodeName
	if node == "" {
		if node, err = nodelocal.NodeName(opts.Network); err != nil {
			return nil, fmt.Errorf("etcd store: no node name given: %w; set ipam.store.nodeName", err)
		}
	}
	if err := validate.NodeName(node); err != nil {
		return nil, fmt.Errorf("etcd store: %w; set ipam.store.nodeName", err)
	}
	s := &Store{
		cfg: etcdclient.Config{
			Endpoints: opts.Endpoints,
			CAFile:    opts.CAFile, CertFile: opts.CertFile, KeyFile: opts.KeyFile,
			DialTimeout: opts.DialTimeout,
		},
		base:    prefix + "/ipam/" + opts.Network + "/",
		node:    node,
		timeout: opts.OpTimeout,
	}
	if s.timeout <= 0 {
		s.timeout = DefaultOpTimeout
	}
	if s.cli, err = etcdclient.New(s.cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Close closes the client (the allocations stay).
func (s *Store) Close() error { return s.cli.Close() }

// Node is the node name recorded with this store's allocations.
func (s *Store) Node() string { return s.node }

// Base is the key prefix of the network, "<prefix>/ipam/<network>/".
func (s *Store) Base() string { return s.base }

// CleanPrefix validates a key prefix and returns it without a trailing '/'
// ("" for "/"); an empty prefix is store.DefaultEtcdPrefix. A prefix is
// '/'-separated segments of letters, digits, '_', '.' and '-', none empty,
// "." or "..".
func CleanPrefix(p string) (string, error) {
	if p == "" {
		p = store.DefaultEtcdPrefix
	}
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("etcd key prefix %q %s", p, why)
	}
	if !strings.HasPrefix(p, "/") {
		return bad("must start with '/'")
	}
	if len(p) > 512 {
		return bad("is longer than 512 bytes")
	}
	clean := strings.TrimSuffix(p, "/")
	if clean == "" {
		return "", nil
	}
	for _, seg := range strings.Split(clean[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return bad("has an empty, '.' or '..' segment")
		}
		for _, c := range []byte(seg) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
				return bad("may hold only letters, digits, '_', '.', '-' and '/'")
			}
		}
	}
	return clean, nil
}

func (s *Store) ipKey(ip netip.Addr) string { return s.base + "ips/" + ip.String() }

func (s *Store) ownerPrefix(o store.Owner) string {
	return s.base + "owners/" + o.ContainerID + "/" + o.IfName + "/"
}

func (s *Store) lastKey(rangeSet int) string { return s.base + "last/" + strconv.Itoa(rangeSet) }

// op runs fn with the operation timeout (or the caller's earlier deadline)
// and describes its error.
func (s *Store) op(ctx context.Context, what string, fn func(ctx context.Context) error) error {
	timeout := s.timeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = max(time.Until(d), 0).Round(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := fn(ctx)
	derr := s.cfg.Describe(timeout, what+" in network "+strconv.Quote(s.network()), err)
	// etcd going away in the middle of a call (connection reset: gRPC
	// Unavailable) is as temporary as one that does not answer in time:
	// the runtime should retry (CNI code 11), not give up on an I/O error.
	if derr != nil && status.Code(err) == codes.Unavailable {
		return fmt.Errorf("%w (%w)", derr, store.ErrBusy)
	}
	return derr
}

func (s *Store) network() string {
	b := strings.TrimSuffix(s.base, "/")
	return b[strings.LastIndexByte(b, '/')+1:]
}

// addr checks an address that becomes part of a key.
func addr(ip netip.Addr) (netip.Addr, error) {
	if !ip.IsValid() || ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid address %v", ip)
	}
	return ip.Unmap(), nil
}

// parseIP reads the address at the end of a key, accepting only the
// canonical form the store writes.
func parseIP(key, prefix string) (netip.Addr, bool) {
	s, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.String() != s || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip, true
}

// Lock implements store.Store: a no-op, since every mutation is a single
// transaction (see the package comment).
func (s *Store) Lock(ctx context.Context) (func() error, error) {
	return func() error { return nil }, nil
}

// Claim implements store.Store.
func (s *Store) Claim(ctx context.Context, c store.Claim) (bool, error) {
	if err := store.ValidateOwner(c.Owner); err != nil {
		return false, err
	}
	ip, err := addr(c.IP)
	if err != nil || c.RangeSet < 0 {
		return false, fmt.Errorf("invalid claim of %v in range set %d", c.IP, c.RangeSet)
	}
	val, err := json.Marshal(record{ContainerID: c.Owner.ContainerID, IfName: c.Owner.IfName, Node: s.node, Time: time.Now().UTC()})
	if err != nil {
		return false, err
	}
	key := s.ipKey(ip)
	var ok bool
	err = s.op(ctx, "claiming "+ip.String(), func(ctx context.Context) error {
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(
				clientv3.OpPut(key, string(val)),
				clientv3.OpPut(s.ownerPrefix(c.Owner)+ip.String(), ""),
				clientv3.OpPut(s.lastKey(c.RangeSet), ip.String()),
			).Commit()
		if err == nil {
			ok = resp.Succeeded
		}
		return err
	})
	return ok, err
}

// Release implements store.Store. It deletes the allocation only if it is
// still the one whose owner it checked (same mod revision).
func (s *Store) Release(ctx context.Context, ip netip.Addr, o store.Owner) (bool, error) {
	if err := store.ValidateOwner(o); err != nil {
		return false, err
	}
	ip, err := addr(ip)
	if err != nil {
		return false, err
	}
	var released bool
	err = s.op(ctx, "releasing "+ip.String(), func(ctx context.Context) error {
		for range 5 { // retried only when the record changes under us
			resp, err := s.cli.Get(ctx, s.ipKey(ip))
			if err != nil {
				return err
			}
			if len(resp.Kvs) == 0 {
				return s.dropIndex(ctx, ip, o)
			}
			kv := resp.Kvs[0]
			var r record
			if json.Unmarshal(kv.Value, &r) != nil || (store.Owner{ContainerID: r.ContainerID, IfName: r.IfName}) != o {
				return s.dropIndex(ctx, ip, o)
			}
			if released, err = s.delete(ctx, ip, o, kv.ModRevision); err != nil || released {
				return err
			}
		}
		return fmt.Errorf("the allocation of %s keeps changing; retry", ip)
	})
	return released, err
}

// delete removes ips/<ip> and o's index key if ips/<ip> is still at rev.
func (s *Store) delete(ctx context.Context, ip netip.Addr, o store.Owner, rev int64) (bool, error) {
	key := s.ipKey(ip)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpDelete(key), clientv3.OpDelete(s.ownerPrefix(o)+ip.String())).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// dropIndex removes a stale index key of o for ip (only hand edits of etcd
// leave one behind: the store changes both keys in one transaction).
func (s *Store) dropIndex(ctx context.Context, ip netip.Addr, o store.Owner) error {
	_, err := s.cli.Delete(ctx, s.ownerPrefix(o)+ip.String())
	return err
}

// ListByOwner implements store.Store (one read of the owner's index keys).
func (s *Store) ListByOwner(ctx context.Context, o store.Owner) ([]netip.Addr, error) {
	if err := store.ValidateOwner(o); err != nil {
		return nil, err
	}
	prefix := s.ownerPrefix(o)
	var out []netip.Addr
	err := s.op(ctx, "listing the addresses of "+o.String(), func(ctx context.Context) error {
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			if ip, ok := parseIP(string(kv.Key), prefix); ok {
				out = append(out, ip)
			}
		}
		return nil
	})
	slices.SortFunc(out, netip.Addr.Compare)
	return out, err
}

// entry is an allocation as read, with what GC needs.
type entry struct {
	store.Allocation
	node    string
	corrupt bool
	rev     int64
}

func (s *Store) list(ctx context.Context) ([]entry, error) {
	prefix := s.base + "ips/"
	var out []entry
	err := s.op(ctx, "listing allocations", func(ctx context.Context) error {
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			ip, ok := parseIP(string(kv.Key), prefix)
			if !ok {
				continue // not written by the store
			}
			e := entry{Allocation: store.Allocation{IP: ip}, rev: kv.ModRevision}
			var r record
			if json.Unmarshal(kv.Value, &r) != nil {
				e.corrupt = true
			} else {
				e.Owner, e.node = store.Owner{ContainerID: r.ContainerID, IfName: r.IfName}, r.Node
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// List implements store.Store: the allocations of every node. A record that
// cannot be parsed is listed with an empty owner (its address stays taken).
func (s *Store) List(ctx context.Context) ([]store.Allocation, error) {
	entries, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]store.Allocation, len(entries))
	for i, e := range entries {
		out[i] = e.Allocation
	}
	slices.SortFunc(out, func(a, b store.Allocation) int { return a.IP.Compare(b.IP) })
	return out, nil
}

// LastReserved implements store.Store (the marker shared by all nodes).
func (s *Store) LastReserved(ctx context.Context, rangeSet int) (netip.Addr, error) {
	if rangeSet < 0 {
		return netip.Addr{}, fmt.Errorf("invalid range set %d", rangeSet)
	}
	var ip netip.Addr
	err := s.op(ctx, "reading the last reserved address", func(ctx context.Context) error {
		resp, err := s.cli.Get(ctx, s.lastKey(rangeSet))
		if err != nil || len(resp.Kvs) == 0 {
			return err
		}
		ip, _ = netip.ParseAddr(string(resp.Kvs[0].Value)) // garbage: no marker
		ip = ip.Unmap()
		return nil
	})
	return ip, err
}

// GC implements store.Store for this node's allocations only: another node's
// allocation is never released, whatever keep says. Records that cannot be
// parsed (no node known) are left alone.
func (s *Store) GC(ctx context.Context, keep func(store.Owner) bool) ([]store.Allocation, error) {
	entries, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	var released []store.Allocation
	var errs []error
	for _, e := range entries {
		if e.corrupt || e.node != s.node || keep(e.Owner) {
			continue
		}
		var ok bool
		err := s.op(ctx, "releasing stale "+e.IP.String(), func(ctx context.Context) error {
			var err error
			ok, err = s.delete(ctx, e.IP, e.Owner, e.rev)
			return err
		})
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if ok { // otherwise it changed since the listing: not stale any more
			released = append(released, e.Allocation)
		}
	}
	slices.SortFunc(released, func(a, b store.Allocation) int { return a.IP.Compare(b.IP) })
	return released, errors.Join(errs...)
}

// NodeAllocation is one allocation as stored: its key at revision Rev, and
// every key to delete with it (the allocation and its owner index key).
type NodeAllocation struct {
	IP   netip.Addr
	Key  string
	Rev  int64
	Keys []string
}

// AllocationsByNode lists the allocations of network under prefix (as in
// Options) by the node that made them, read with cli: what a caller needs to
// release a departed node's allocations in a transaction of its own (see
// registry.Reclaim). Records that do not parse are left out, and so are
// Services' allocations: a Service, not the node that wrote its claim,
// holds them, so a departed node takes none of them with it.
func AllocationsByNode(ctx context.Context, cli *clientv3.Client, prefix, network string) (map[string][]NodeAllocation, error) {
	prefix, err := CleanPrefix(prefix)
	if err != nil {
		return nil, err
	}
	s := &Store{cli: cli, base: prefix + "/ipam/" + network + "/", timeout: DefaultOpTimeout}
	entries, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]NodeAllocation{}
	for _, e := range entries {
		if e.corrupt || e.node == "" || e.Owner.Kind() == store.OwnerService {
			continue
		}
		key := s.ipKey(e.IP)
		out[e.node] = append(out[e.node], NodeAllocation{IP: e.IP, Key: key, Rev: e.rev, Keys: []string{key, s.ownerPrefix(e.Owner) + e.IP.String()}})
	}
	return out, nil
}
