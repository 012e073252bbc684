package registry

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/pkg/validate"
)

// Reclaiming what departed nodes hold.
//
// A node's record goes with its lease, but its subnet lease (and its
// allocations in a shared LAN pool) stay, so that a node that is only down
// for a while gets them back. A node gone for longer than a grace period is
// taken to be gone for good, and the surviving agents release what it holds:
//
//	<prefix>/departed/<network>/<name>   "<RFC 3339 time>"   no lease
//
// is the departure marker: written (create-only, only while the node has no
// record, and only while what showed it to be a holder is unchanged) by the
// first agent that sees a holder without a record; the time is that agent's
// clock. The last condition is what keeps an agent whose view is stale (it
// read the LAN pool before another agent reclaimed the node) from marking a
// node that holds nothing any more. A marker whose node has a record again,
// or holds nothing, is deleted.
// Once the grace period has passed since the marker's time, every agent may
// try [Registry.Reclaim]: one transaction that deletes the marker, the
// node's subnet leases and the given extra keys (its LAN allocations), if
// and only if the node still has no record, the marker is the very one read
// (same mod revision) and each released key is unchanged. Deleting the
// marker in that same transaction is what makes it happen once: of any
// number of agents, the first commit wins and every other one's condition
// on the marker fails. An agent crash cannot leave half a reclaim behind.

// DepartedPrefix is the key prefix of the departure markers.
func (r *Registry) DepartedPrefix() string {
	return r.cfg.Prefix + "/departed/" + r.cfg.Network + "/"
}

// Departure is a node that holds something but has no record, since Since.
type Departure struct {
	Node  string
	Since time.Time
	rev   int64 // the marker's mod revision
}

// Held is what a departed node holds outside the registry (an allocation
// in a shared LAN pool): keys to delete if Key is still at Rev.
type Held struct {
	Key    string
	Rev    int64
	Delete []string // Key and its index keys
}

// Departures reads the node records, subnet leases and markers at one
// revision; marks every holder (of a subnet lease, or of keys in elsewhere,
// a node's allocations outside the registry as read by the caller) that has
// no record and no marker yet, as of now; deletes the markers of nodes that
// have a record again or hold nothing; and returns the departures.
func (r *Registry) Departures(ctx context.Context, elsewhere map[string][]Held, now time.Time) ([]Departure, error) {
	var resp *clientv3.TxnResponse
	err := r.op(ctx, "reading nodes, subnet leases and departures", func(ctx context.Context) error {
		var err error
		resp, err = r.cli.Txn(ctx).Then(
			clientv3.OpGet(r.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(r.SubnetsPrefix(), clientv3.WithPrefix()),
			clientv3.OpGet(r.DepartedPrefix(), clientv3.WithPrefix()),
		).Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	alive := map[string]bool{}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		alive[strings.TrimPrefix(string(kv.Key), r.NodesPrefix())] = true
	}
	// holds is, for each holder, one key (at its revision) that shows it
	// holds something: a subnet lease read here, or else one of elsewhere's.
	holds := map[string]Held{}
	for name, hs := range elsewhere {
		if len(hs) > 0 {
			holds[name] = hs[0]
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		holds[string(kv.Value)] = Held{Key: string(kv.Key), Rev: kv.ModRevision}
	}
	var out []Departure
	marked := map[string]bool{}
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		name := strings.TrimPrefix(string(kv.Key), r.DepartedPrefix())
		marked[name] = true
		if _, held := holds[name]; alive[name] || !held {
			if err := r.unmark(ctx, name, kv.ModRevision); err != nil {
				return nil, err
			}
			continue
		}
		since, err := time.Parse(time.RFC3339Nano, string(kv.Value))
		if err != nil {
			since = now // unreadable: start the grace period over from here
		}
		out = append(out, Departure{Node: name, Since: since, rev: kv.ModRevision})
	}
	for _, name := range slices.Sorted(maps.Keys(holds)) {
		if alive[name] || marked[name] || validate.NodeName(name) != nil {
			continue
		}
		d, ok, err := r.mark(ctx, name, holds[name], now)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, d)
		}
	}
	return out, nil
}

// mark writes name's departure marker unless it has one or a record, or
// evidence (the key that showed it to hold something) changed since it was
// read: the node may have been reclaimed in between.
func (r *Registry) mark(ctx context.Context, name string, evidence Held, now time.Time) (Departure, bool, error) {
	key := r.DepartedPrefix() + name
	d := Departure{Node: name, Since: now.UTC()}
	err := r.op(ctx, "marking node "+name+" departed", func(ctx context.Context) error {
		resp, err := r.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(r.nodeKey(name)), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
				clientv3.Compare(clientv3.ModRevision(evidence.Key), "=", evidence.Rev)).
			Then(clientv3.OpPut(key, d.Since.Format(time.RFC3339Nano))).
			Commit()
		if err == nil && resp.Succeeded {
			d.rev = resp.Header.Revision
		}
		return err
	})
	return d, d.rev != 0, err
}

// unmark deletes name's marker if it is still at rev.
func (r *Registry) unmark(ctx context.Context, name string, rev int64) error {
	key := r.DepartedPrefix() + name
	return r.op(ctx, "clearing the departure of node "+name, func(ctx context.Context) error {
		_, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
		return err
	})
}

// Reclaim releases what departed node d holds — its subnet leases and held
// — once grace has passed since d.Since, in one transaction that succeeds
// only if the node still has no record, d's marker is unchanged and every
// released key is as read (see the comment at the top of this file). It
// returns the subnets released, and false when the grace period has not
// passed or another agent (or the node's return) got there first.
func (r *Registry) Reclaim(ctx context.Context, d Departure, grace time.Duration, now time.Time, held []Held) ([]netip.Prefix, bool, error) {
	if d.rev == 0 || now.Sub(d.Since) < grace {
		return nil, false, nil
	}
	leases, err := r.Subnets(ctx)
	if err != nil {
		return nil, false, err
	}
	marker := r.DepartedPrefix() + d.Node
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(r.nodeKey(d.Node)), "=", 0),
		clientv3.Compare(clientv3.ModRevision(marker), "=", d.rev),
	}
	ops := []clientv3.Op{clientv3.OpDelete(marker)}
	var subnets []netip.Prefix
	for p, owner := range leases {
		if owner == d.Node {
			key := r.subnetKey(p)
			cmps = append(cmps, clientv3.Compare(clientv3.Value(key), "=", d.Node))
			ops = append(ops, clientv3.OpDelete(key))
			subnets = append(subnets, p)
		}
	}
	if len(subnets) == 0 && len(held) == 0 {
		// Nothing left to release (it went some other way): the marker
		// goes, and nothing was reclaimed.
		return nil, false, r.unmark(ctx, d.Node, d.rev)
	}
	// etcd caps a transaction at 128 operations (--max-txn-ops): what does
	// not fit in the last one goes first, in transactions under the same
	// conditions that leave the marker (the last one deletes it).
	for len(held) > heldPerTxn {
		if err := r.releaseHeld(ctx, d, cmps[:2], held[:heldPerTxn]); err != nil {
			return nil, false, err
		}
		held = held[heldPerTxn:]
	}
	c, o := heldOps(held)
	cmps, ops = append(cmps, c...), append(ops, o...)
	var won bool
	err = r.op(ctx, fmt.Sprintf("reclaiming what departed node %s holds", d.Node), func(ctx context.Context) error {
		resp, err := r.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err == nil {
			won = resp.Succeeded
		}
		return err
	})
	if err != nil || !won {
		return nil, false, err
	}
	slices.SortFunc(subnets, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return subnets, true, nil
}

// heldPerTxn keeps a reclaim transaction within etcd's default 128
// operations: subnet leases and the marker need a few, each held key up to
// three (its compare, itself and its index key).
const heldPerTxn = 32

func heldOps(held []Held) ([]clientv3.Cmp, []clientv3.Op) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, h := range held {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(h.Key), "=", h.Rev))
		for _, k := range h.Delete {
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	return cmps, ops
}

// releaseHeld deletes some of what d holds under base's conditions (no
// record, marker unchanged), leaving the marker for the final transaction.
func (r *Registry) releaseHeld(ctx context.Context, d Departure, base []clientv3.Cmp, held []Held) error {
	c, o := heldOps(held)
	return r.op(ctx, fmt.Sprintf("releasing allocations of departed node %s", d.Node), func(ctx context.Context) error {
		_, err := r.cli.Txn(ctx).If(append(slices.Clone(base), c...)...).Then(o...).Commit()
		return err
	})
}
