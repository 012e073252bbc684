package registry

import (
	"context"
	"fmt"
	"net/netip"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReleaseSubnet deletes node's lease of p, only if node holds it. Only the
// tests release a single lease; villaged releases a departed node's leases
// with Reclaim.
func (r *Registry) ReleaseSubnet(ctx context.Context, p netip.Prefix, node string) error {
	key := r.subnetKey(p)
	return r.op(ctx, fmt.Sprintf("releasing %s of node %q", key, node), func(ctx context.Context) error {
		resp, err := r.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", node)).
			Then(clientv3.OpDelete(key)).
			Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("%s is not held by node %q", key, node)
		}
		return err
	})
}
