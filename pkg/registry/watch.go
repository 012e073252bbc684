package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// FollowRetry is the pause before listing again after a failed list or a
// broken watch.
var FollowRetry = time.Second

// Follow keeps feed saying the node list until ctx is done (then it
// returns ctx's error): the whole list after each list (feed.Reset), then
// each watched change (feed.Put, feed.Remove). It lists at one revision and
// watches from the next, so no change is missed between the two; when the
// watch breaks (compaction, etcd restarted or unreachable) it lists again.
// logf gets the errors it recovers from (records that do not decode, failed
// lists).
func (r *Registry) Follow(ctx context.Context, feed *Feed, logf func(format string, args ...any)) error {
	for {
		err := r.followOnce(ctx, feed, logf)
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

func (r *Registry) followOnce(ctx context.Context, feed *Feed, logf func(string, ...any)) error {
	list, rev, bad, err := r.Nodes(ctx)
	if err != nil {
		return err
	}
	if bad != nil {
		logf("registry: skipping records: %v", bad)
	}
	feed.Reset(list, rev)
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
				feed.Remove(name, ev.Kv.ModRevision)
			case clientv3.EventTypePut:
				n, err := r.decode(ev.Kv.Key, ev.Kv.Value)
				if err != nil {
					logf("registry: skipping record: %v", err)
					feed.Remove(name, ev.Kv.ModRevision)
					continue
				}
				feed.Put(n, ev.Kv.ModRevision)
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("etcd at %v: the watch of %s ended: %w", r.cfg.Etcd.Endpoints, r.NodesPrefix(), errWatchClosed)
}

var errWatchClosed = errors.New("watch channel closed")
