package registry

import (
	"maps"
	"slices"
	"sync"
)

// Batch is what a Feed hands its reader: either the whole node list (Full)
// or only the records put and the names removed since the previous batch,
// so that the reader's cost per watch event does not grow with the number
// of nodes.
type Batch struct {
	// Full says Nodes is every node: a name the reader knows that is not
	// in Nodes is gone. The first batch of a feed is full, and so is the
	// one after a relist or a resync.
	Full bool
	// Nodes is sorted by name: every node (Full), or the records put since
	// the previous batch, each the latest put under its name.
	Nodes []Node
	// Removed is sorted: the names removed since the previous batch and not
	// put again after (never set when Full).
	Removed []string
	// Revision is the registry's revision of the latest change in the batch.
	Revision int64
}

// Feed carries a registry's changes from its follower (Follow, the
// kubernetes registry's informer) to one reader and coalesces what the
// reader has not taken yet: several puts of one name keep the last, a put
// then a removal keep the removal, a Reset drops everything pending. So
// nothing is lost while the reader is busy, and a burst costs the reader
// one batch. Its methods are safe for concurrent use.
type Feed struct {
	mu      sync.Mutex
	open    bool // Ready is signalled (see Open)
	full    bool
	pending map[string]*Node // nil: removed (never under full)
	rev     int64
	ready   chan struct{} // capacity 1
}

// NewFeed returns a feed whose first batch is full (the reader starts from
// nothing). It does not signal Ready until Open or Reset is called, so the
// follower can put the records of its first list one at a time and have the
// reader see them as one full batch.
func NewFeed() *Feed {
	return &Feed{full: true, pending: map[string]*Node{}, ready: make(chan struct{}, 1)}
}

// Ready has a value when a batch can be taken.
func (f *Feed) Ready() <-chan struct{} { return f.ready }

// Open lets Ready signal; the first list is complete.
func (f *Feed) Open() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = true
	f.signal()
}

// Reset replaces everything pending with the whole node list at rev: the
// next batch is full. It opens the feed.
func (f *Feed) Reset(nodes []Node, rev int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.full, f.open, f.rev = true, true, rev
	f.pending = make(map[string]*Node, len(nodes))
	for _, n := range nodes {
		n.PodCIDRs = slices.Clone(n.PodCIDRs)
		f.pending[n.Name] = &n
	}
	f.signal()
}

// Put records that n is the node's record at rev.
func (f *Feed) Put(n Node, rev int64) {
	n.PodCIDRs = slices.Clone(n.PodCIDRs)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[n.Name] = &n
	f.note(rev)
}

// Remove records that the node name has no record (any more) at rev.
func (f *Feed) Remove(name string, rev int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.full {
		delete(f.pending, name)
	} else {
		f.pending[name] = nil
	}
	f.note(rev)
}

func (f *Feed) note(rev int64) {
	if rev > f.rev {
		f.rev = rev
	}
	f.signal()
}

// signal makes Ready have a value, when there is something to take. The
// caller holds f.mu.
func (f *Feed) signal() {
	if !f.open || (!f.full && len(f.pending) == 0) {
		return
	}
	select {
	case f.ready <- struct{}{}:
	default:
	}
}

// Take returns what is pending and empties the feed; ok is false when there
// was nothing (a Ready value left over from a batch already taken).
func (f *Feed) Take() (b Batch, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.open || (!f.full && len(f.pending) == 0) {
		return Batch{}, false
	}
	b = Batch{Full: f.full, Revision: f.rev, Nodes: make([]Node, 0, len(f.pending))}
	for _, name := range slices.Sorted(maps.Keys(f.pending)) {
		if n := f.pending[name]; n != nil {
			b.Nodes = append(b.Nodes, *n)
		} else {
			b.Removed = append(b.Removed, name)
		}
	}
	f.full = false
	f.pending = map[string]*Node{}
	return b, true
}

// ApplyTo makes nodes (by name) what the reader of b knows after it.
func (b Batch) ApplyTo(nodes map[string]Node) {
	if b.Full {
		clear(nodes)
	}
	for _, name := range b.Removed {
		delete(nodes, name)
	}
	for _, n := range b.Nodes {
		nodes[n.Name] = n
	}
}
