package registry

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/pkg/validate"
)

// ErrExhausted is returned when every subnet of the cluster range is held.
var ErrExhausted = errors.New("no free pod subnet")

// SubnetSpace is the set of pod subnets a cluster range is cut into.
type SubnetSpace struct {
	Cluster netip.Prefix
	Bits    int // prefix length of one node's subnet
}

// NewSubnetSpace validates cluster and bits: bits must be longer than the
// cluster's prefix and leave room for pods (at most /30, /126).
func NewSubnetSpace(cluster *net.IPNet, bits int) (SubnetSpace, error) {
	if cluster == nil {
		return SubnetSpace{}, errors.New("no clusterCIDR to lease pod subnets from; set clusterCIDR or give ipam ranges")
	}
	ones, _ := cluster.Mask.Size()
	addr, ok := netip.AddrFromSlice(cluster.IP)
	if !ok {
		return SubnetSpace{}, fmt.Errorf("clusterCIDR %s: not an IP network", cluster)
	}
	p := netip.PrefixFrom(addr.Unmap(), ones).Masked()
	if bits <= p.Bits() || bits > p.Addr().BitLen()-2 {
		return SubnetSpace{}, fmt.Errorf("subnetLen /%d does not fit clusterCIDR %s: want /%d to /%d", bits, p, p.Bits()+1, p.Addr().BitLen()-2)
	}
	return SubnetSpace{Cluster: p, Bits: bits}, nil
}

// Count is how many subnets there are (capped at 2^62).
func (s SubnetSpace) Count() uint64 {
	n := s.Bits - s.Cluster.Bits()
	if n > 62 {
		n = 62
	}
	return 1 << n
}

// Nth is the i-th subnet (0-based) of the space.
func (s SubnetSpace) Nth(i uint64) netip.Prefix {
	base := new(big.Int).SetBytes(s.Cluster.Addr().AsSlice())
	off := new(big.Int).Lsh(new(big.Int).SetUint64(i), uint(s.Cluster.Addr().BitLen()-s.Bits))
	b := base.Add(base, off).FillBytes(make([]byte, s.Cluster.Addr().BitLen()/8))
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, s.Bits)
}

// Contains reports whether p is one of the space's subnets.
func (s SubnetSpace) Contains(p netip.Prefix) bool {
	return p.Bits() == s.Bits && p.Masked() == p && s.Cluster.Contains(p.Addr())
}

func (r *Registry) subnetKey(p netip.Prefix) string { return r.SubnetsPrefix() + p.String() }

// Subnets lists every subnet lease: subnet -> node name.
func (r *Registry) Subnets(ctx context.Context) (map[netip.Prefix]string, error) {
	var resp *clientv3.GetResponse
	err := r.op(ctx, "listing "+r.SubnetsPrefix(), func(ctx context.Context) error {
		var err error
		resp, err = r.cli.Get(ctx, r.SubnetsPrefix(), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Prefix]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		p, err := netip.ParsePrefix(strings.TrimPrefix(string(kv.Key), r.SubnetsPrefix()))
		if err != nil {
			continue // not ours to interpret; it is never handed out either
		}
		out[p] = string(kv.Value)
	}
	return out, nil
}

// HeldSubnet returns the subnet of space that node already holds, if any
// (the lowest one, should it somehow hold several).
func (r *Registry) HeldSubnet(ctx context.Context, space SubnetSpace, node string) (netip.Prefix, bool, error) {
	leases, err := r.Subnets(ctx)
	if err != nil {
		return netip.Prefix{}, false, err
	}
	p, ok := held(leases, space, node)
	return p, ok, nil
}

func held(leases map[netip.Prefix]string, space SubnetSpace, node string) (netip.Prefix, bool) {
	var mine []netip.Prefix
	for p, owner := range leases {
		if owner == node && space.Contains(p) {
			mine = append(mine, p)
		}
	}
	if len(mine) == 0 {
		return netip.Prefix{}, false
	}
	slices.SortFunc(mine, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return mine[0], true
}

// LeaseSubnet returns the pod subnet node holds in space, taking the first
// free one when it holds none. Taking is a transaction that succeeds only if
// the subnet's key was never created, so under any interleaving of any
// number of nodes each subnet has exactly one holder; a node that loses a
// race moves on to the next free subnet. The lease has no TTL: it survives
// restarts of the node and of its agent. Like flannel, the first subnet of
// the range (holding the cluster's network address) is handed out last.
func (r *Registry) LeaseSubnet(ctx context.Context, space SubnetSpace, node string) (netip.Prefix, error) {
	if err := validate.NodeName(node); err != nil {
		return netip.Prefix{}, err
	}
	leases, err := r.Subnets(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	if p, ok := held(leases, space, node); ok {
		return p, nil
	}
	n := space.Count()
	for k := uint64(0); k < n; k++ {
		p := space.Nth((k + 1) % n) // 1, 2, ..., n-1, then 0
		if _, taken := leases[p]; taken {
			continue
		}
		key := r.subnetKey(p)
		var won bool
		var owner string
		err := r.op(ctx, fmt.Sprintf("leasing %s to node %q", key, node), func(ctx context.Context) error {
			resp, err := r.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, node)).
				Else(clientv3.OpGet(key)).
				Commit()
			if err != nil {
				return err
			}
			won = resp.Succeeded
			if !won && len(resp.Responses) > 0 {
				if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
					owner = string(kvs[0].Value)
				}
			}
			return nil
		})
		if err != nil {
			return netip.Prefix{}, err
		}
		if won || owner == node {
			return p, nil
		}
		leases[p] = owner
	}
	return netip.Prefix{}, fmt.Errorf("%w in %s: all %d /%d subnets are leased (see %s); use a larger clusterCIDR or a longer subnetLen, or release the subnets of removed nodes",
		ErrExhausted, space.Cluster, n, space.Bits, r.SubnetsPrefix())
}
