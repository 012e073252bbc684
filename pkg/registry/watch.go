package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Snapshot is the full node list at one revision.
type Snapshot struct {
	Nodes    []Node // sorted by name
	Revision int64
}

// FollowRetry is the pause before listing again after a failed list or a
// broken watch.
var FollowRetry = time.Second

// Follow sends a snapshot of the node list on out after the first list and
// after every batch of watched changes, until ctx is done (then it returns
// ctx's error). It lists at one revision and watches from the next, so no
// change is missed between the two; when the watch breaks (compaction, etcd
// restarted or unreachable) it lists again. Only the newest snapshot is
// kept: a slow receiver skips intermediate ones, never the latest. logf gets
// the errors it recovers from (records that do not decode, failed lists).
func (r *Registry) Follow(ctx context.Context, out chan Snapshot, logf func(format string, args ...any)) error {
	for {
		err := r.followOnce(ctx, out, logf)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		logf("registry: %v; listing again in %s", err, FollowRetry)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(FollowRetry):
		}
	}
}

// send replaces any unread snapshot on out (a channel of capacity 1 that
// only Follow writes) with s.
func send(ctx context.Context, out chan Snapshot, s Snapshot) error {
	select {
	case <-out:
	default:
	}
	select {
	case out <- s:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Registry) followOnce(ctx context.Context, out chan Snapshot, logf func(string, ...any)) error {
	list, rev, bad, err := r.Nodes(ctx)
	if err != nil {
		return err
	}
	if bad != nil {
		logf("registry: skipping records: %v", bad)
	}
	nodes := make(map[string]Node, len(list))
	for _, n := range list {
		nodes[n.Name] = n
	}
	if err := send(ctx, out, snapshot(nodes, rev)); err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.cli.Watch(wctx, r.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return r.cfg.Etcd.Describe(0, "watching "+r.NodesPrefix(), err)
		}
		if resp.IsProgressNotify() {
			continue
		}
		for _, ev := range resp.Events {
			name := string(ev.Kv.Key[len(r.NodesPrefix()):])
			switch ev.Type {
			case clientv3.EventTypeDelete:
				delete(nodes, name)
			case clientv3.EventTypePut:
				n, err := r.decode(ev.Kv.Key, ev.Kv.Value)
				if err != nil {
					logf("registry: skipping record: %v", err)
					delete(nodes, name)
					continue
				}
				nodes[name] = n
			}
		}
		if err := send(ctx, out, snapshot(nodes, resp.Header.Revision)); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("etcd at %v: the watch of %s ended: %w", r.cfg.Etcd.Endpoints, r.NodesPrefix(), errWatchClosed)
}

var errWatchClosed = errors.New("watch channel closed")

func snapshot(nodes map[string]Node, rev int64) Snapshot {
	s := Snapshot{Revision: rev, Nodes: make([]Node, 0, len(nodes))}
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		n := nodes[name]
		n.PodCIDRs = slices.Clone(n.PodCIDRs)
		s.Nodes = append(s.Nodes, n)
	}
	return s
}
