package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Registration is this node's record kept under its lease. It belongs to
// one goroutine (the agent's keep-alive loop) and is not safe for concurrent
// use. Dropping it without a call leaves the lease to expire on its own,
// which is what a stopping agent wants: its peers keep their routes to it
// until the TTL says it is gone.
type Registration struct {
	r     *Registry
	node  Node
	value string
	lease clientv3.LeaseID
}

// Register puts n under a new lease of the configured TTL and returns the
// registration to keep alive with Refresh. A record of the same name (this
// node's previous run) is replaced; the old lease then expires holding no
// key.
func (r *Registry) Register(ctx context.Context, n Node) (*Registration, error) {
	g := &Registration{r: r}
	if err := g.set(n); err != nil {
		return nil, err
	}
	if err := g.grantAndPut(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// Node is the registered record.
func (g *Registration) Node() Node { return g.node }

// Lease is the current lease.
func (g *Registration) Lease() clientv3.LeaseID { return g.lease }

func (g *Registration) set(n Node) error {
	if err := n.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encoding node record %q: %w", n.Name, err)
	}
	g.node, g.value = n, string(b)
	return nil
}

func (g *Registration) grantAndPut(ctx context.Context) error {
	r := g.r
	ttl := int64(r.cfg.TTL.Seconds())
	var lease clientv3.LeaseID
	err := r.op(ctx, fmt.Sprintf("granting a %ds lease for node %q", ttl, g.node.Name), func(ctx context.Context) error {
		resp, err := r.cli.Grant(ctx, ttl)
		if err == nil {
			lease = resp.ID
		}
		return err
	})
	if err != nil {
		return err
	}
	g.lease = lease
	return g.put(ctx)
}

func (g *Registration) put(ctx context.Context) error {
	key := g.r.nodeKey(g.node.Name)
	return g.r.op(ctx, fmt.Sprintf("writing %s under lease %x", key, int64(g.lease)), func(ctx context.Context) error {
		_, err := g.r.cli.Put(ctx, key, g.value, clientv3.WithLease(g.lease))
		return err
	})
}

// Refresh renews the lease once and makes sure the record is still there
// and still says what it should (a record deleted or changed by hand is
// written again). When the lease has expired (etcd was unreachable for a
// TTL, or the lease was revoked) it registers again under a new lease and
// says so with renewed == true.
func (g *Registration) Refresh(ctx context.Context) (renewed bool, err error) {
	r := g.r
	err = r.op(ctx, fmt.Sprintf("renewing lease %x of node %q", int64(g.lease), g.node.Name), func(ctx context.Context) error {
		_, err := r.cli.KeepAliveOnce(ctx, g.lease)
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return true, g.grantAndPut(ctx)
	}
	if err != nil {
		return false, err
	}
	return false, g.ensure(ctx)
}

// ensure writes the record again unless it is in place with our lease.
func (g *Registration) ensure(ctx context.Context) error {
	key := g.r.nodeKey(g.node.Name)
	return g.r.op(ctx, "checking "+key, func(ctx context.Context) error {
		_, err := g.r.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(key), "=", g.value),
				clientv3.Compare(clientv3.LeaseValue(key), "=", g.lease)).
			Else(clientv3.OpPut(key, g.value, clientv3.WithLease(g.lease))).
			Commit()
		return err
	})
}

// Update replaces the record (this node's underlay address or subnets
// changed), keeping the lease; a lost lease is granted anew.
func (g *Registration) Update(ctx context.Context, n Node) error {
	if n.Name != g.node.Name {
		return fmt.Errorf("registration of node %q cannot become node %q", g.node.Name, n.Name)
	}
	if err := g.set(n); err != nil {
		return err
	}
	err := g.put(ctx)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return g.grantAndPut(ctx)
	}
	return err
}
