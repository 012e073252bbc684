package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/kuberegistry"
	"github.com/village-cni/village/pkg/metrics"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/registry"
)

// source is where the peers come from and this node's record goes: the
// etcd registry or the Kubernetes API. Run, sync and status use it the
// same way, so both feed the same overlay.Update path and periodic repair.
type source interface {
	// nodes lists every node record once (sync, status).
	nodes(ctx context.Context) (nodes []registry.Node, rev int64, bad error, err error)
	// podCIDRs are this node's pod subnets; lease says run may take them
	// (etcd leases one out of clusterCIDR), else it only reads what the
	// registry holds (nil when nothing).
	podCIDRs(ctx context.Context, lease bool) ([]*net.IPNet, error)
	// follow keeps this node's record published (first, then each value
	// of records) and feed saying the node list (the whole list first,
	// then the changes) until ctx is done.
	follow(ctx context.Context, first registry.Node, records <-chan registry.Node, feed *registry.Feed, m *metrics.Metrics, logf func(string, ...any))
	// where names the registry and this node's record, for messages.
	where() string
	close()
}

// openSource connects to the backend's registry (nil when it has none).
// The kubernetes registry goes through the process's one Kubernetes side,
// its Node informer the shared one.
func (n *node) openSource() (source, error) {
	c := n.c
	r := c.Registry()
	switch {
	case r == nil:
		return nil, nil
	case r.Type == netconf.RegistryKubernetes:
		side, err := n.kubeSide()
		if err != nil {
			return nil, fmt.Errorf("kubernetes registry: %w", err)
		}
		cfg := kuberegistry.Config{Node: c.Node, Check: kubeCheck, Resync: n.resync, Nodes: side.nodes()}
		return kubeSource{kuberegistry.NewForClient(side.cs, cfg, side.rc.Host)}, nil
	default:
		reg, closeReg, err := c.openRegistry()
		if err != nil {
			return nil, err
		}
		return &etcdSource{c: c, reg: reg, closeFn: closeReg, lease: newLeaseWatch(reg.Config().TTL)}, nil
	}
}

// etcdSource is the etcd registry: records under a lease, subnets leased
// out of clusterCIDR.
type etcdSource struct {
	c       *Conf
	reg     *registry.Registry
	closeFn func()
	lease   *leaseWatch // what keep knows of this node's lease (outage.go)
}

func (s *etcdSource) nodes(ctx context.Context) ([]registry.Node, int64, error, error) {
	return s.reg.Nodes(ctx)
}

func (s *etcdSource) podCIDRs(ctx context.Context, lease bool) ([]*net.IPNet, error) {
	sp, err := s.c.subnetSpace()
	if err != nil {
		return nil, err
	}
	if lease {
		p, err := s.reg.LeaseSubnet(ctx, sp, s.c.Node)
		if err != nil {
			return nil, err
		}
		return cidr.IPNets([]netip.Prefix{p}), nil
	}
	p, ok, err := s.reg.HeldSubnet(ctx, sp, s.c.Node)
	if err != nil || !ok {
		return nil, err
	}
	return cidr.IPNets([]netip.Prefix{p}), nil
}

func (s *etcdSource) follow(ctx context.Context, first registry.Node, records <-chan registry.Node, feed *registry.Feed, m *metrics.Metrics, logf func(string, ...any)) {
	done := make(chan struct{})
	go func() { defer close(done); _ = s.reg.Follow(ctx, feed, logf) }()
	keep(ctx, s.reg, first, records, m, s.lease, logf)
	<-done
}

func (s *etcdSource) where() string {
	return fmt.Sprintf("etcd at %v, %s", s.c.Registry().Endpoints, s.reg.NodesPrefix()+s.c.Node)
}

func (s *etcdSource) close() { s.closeFn() }

// kubeSource is the Kubernetes API: pod subnets from the Node's
// spec.podCIDRs, the record as annotations on the Node.
type kubeSource struct{ k *kuberegistry.Registry }

func (s kubeSource) nodes(ctx context.Context) ([]registry.Node, int64, error, error) {
	return s.k.Nodes(ctx)
}

func (s kubeSource) podCIDRs(ctx context.Context, lease bool) ([]*net.IPNet, error) {
	ps, err := s.k.PodCIDRs(ctx)
	if err != nil {
		if !lease {
			return nil, nil
		}
		return nil, err
	}
	return cidr.IPNets(ps), nil
}

func (s kubeSource) follow(ctx context.Context, first registry.Node, records <-chan registry.Node, feed *registry.Feed, _ *metrics.Metrics, logf func(string, ...any)) {
	s.k.Run(ctx, first, records, feed, logf)
}

func (s kubeSource) where() string { return s.k.Where() }
func (s kubeSource) close()        {}

// kubeCheck is how often the kubernetes registry compares this node's
// annotations with the informer's copy (no request unless they differ).
const kubeCheck = 10 * time.Second
