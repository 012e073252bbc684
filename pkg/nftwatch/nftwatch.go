// Package nftwatch follows the kernel's nf_tables notifications of one
// network namespace (the multicast group NFNLGRP_NFTABLES) and tells the
// callers whose tables changed, so a table that a firewall reload or
// `nft flush ruleset` removed is put back at once instead of at the next
// periodic repair.
//
// # Design
//
//   - One netlink socket joined to the group. Of each message only the
//     header and the table-name attribute are read (attribute 1 of every
//     nf_tables object: NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE,
//     NFTA_SET_TABLE, NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE,
//     NFTA_FLOWTABLE_TABLE). google/nftables' Monitor (v0.3.0) is not used:
//     it decodes every rule's expressions, names no table for set
//     elements, and ends on the first receive error, which ENOBUFS is.
//   - Callers register a match on a Change (Tables builds the usual one) and
//     get a channel of capacity 1 that receives when a matching change was
//     seen. The send never blocks and a full channel absorbs the signal,
//     so however fast the kernel changes, a caller has at most one repair
//     in flight (the one it is running) and one queued (the full channel):
//     a table flushed ten times a second costs at most ten repairs a
//     second, not one per notification.
//   - The watcher does not tell the caller's own writes from others': the
//     caller's repair compares the kernel with what it wants and writes
//     nothing when they are equal (pkg/masq.Keep, the policy controller's
//     repair). Reading back writes nothing and sends no notification, so
//     the one repair an own write triggers finds nothing to do and ends
//     there: no loop.
//   - Overflow: when the socket's receive buffer overflowed (ENOBUFS)
//     some notifications are lost, so every registered channel receives
//     (a full repair of everything watched). A socket that fails otherwise
//     is made again after a pause, and every channel receives then too.
package nftwatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Object is the kind of nf_tables object a notification is about.
type Object uint8

// The objects a notification can be about.
const (
	Table Object = iota + 1
	Chain
	Rule
	Set
	Element
	StatefulObject // a named counter, quota, limit...
	Flowtable
)

func (o Object) String() string {
	switch o {
	case Table:
		return "table"
	case Chain:
		return "chain"
	case Rule:
		return "rule"
	case Set:
		return "set"
	case Element:
		return "element"
	case StatefulObject:
		return "object"
	case Flowtable:
		return "flowtable"
	}
	return fmt.Sprintf("object %d", uint8(o))
}

// Change is one notification: an object of table Table (family Family,
// an NFPROTO_* value) added or, with Deleted, removed.
type Change struct {
	Family  uint8
	Table   string
	Object  Object
	Deleted bool
}

func (c Change) String() string {
	verb := "new"
	if c.Deleted {
		verb = "deleted"
	}
	return fmt.Sprintf("%s %s in table %s (family %d)", verb, c.Object, c.Table, c.Family)
}

// Tables matches every change to a table of one of the names, in any
// family.
func Tables(names ...string) func(Change) bool {
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	return func(c Change) bool { return set[c.Table] }
}

// Options configure a Watcher.
type Options struct {
	// NetNS is a descriptor of the network namespace to follow (0: the
	// calling thread's at each dial, which is the process's for villaged).
	NetNS int
	// ReadBuffer is the socket's receive buffer (DefaultReadBuffer when 0).
	ReadBuffer int
	// Retry is the pause before a failed socket is made again
	// (DefaultRetry when 0).
	Retry time.Duration
	// Logf receives the socket's failures; nil discards.
	Logf func(string, ...any)
}

// Defaults.
const (
	// DefaultReadBuffer holds the notifications of a large transaction (a
	// policy table of thousands of rules and elements) while the watcher
	// is scheduled out; overflowing it costs one full repair.
	DefaultReadBuffer = 4 << 20
	DefaultRetry      = 2 * time.Second
)

// Watcher follows one namespace's nf_tables notifications.
type Watcher struct {
	opts  Options
	mu    sync.Mutex
	subs  []sub
	elems []elems
	// overflows counts the ENOBUFS the socket reported; up says the
	// socket is joined to the group now.
	overflows atomic.Int64
	up        atomic.Bool
}

type sub struct {
	match func(Change) bool
	out   chan struct{}
}

// elems is a follower of some sets' elements (FollowElements).
type elems struct {
	table  string
	sets   []string
	update func(keys [][]byte, deleted bool)
	reset  func()
}

// New returns a Watcher; Register the tables, then Run it.
func New(opts Options) *Watcher {
	if opts.ReadBuffer <= 0 {
		opts.ReadBuffer = DefaultReadBuffer
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultRetry
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	return &Watcher{opts: opts}
}

// Register returns a channel (capacity 1, coalescing) that receives after
// a change match accepts, and after any notification may have been lost.
// Register before Run.
func (w *Watcher) Register(match func(Change) bool) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(chan struct{}, 1)
	w.subs = append(w.subs, sub{match: match, out: out})
	return out
}

// FollowElements has update called, in the watcher's goroutine, with the
// keys of the elements each notification adds to (or deletes from) one of
// the named sets of the named table (any family), in the kernel's order,
// and reset whenever some may have been missed: when the socket is joined
// (after a failure too) and when it overflowed, reset reading the sets
// whole. A table deleted whole announces no element of its sets, so what
// update kept is what the sets held then. Register before Run.
func (w *Watcher) FollowElements(table string, sets []string, update func(keys [][]byte, deleted bool), reset func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.elems = append(w.elems, elems{table: table, sets: sets, update: update, reset: reset})
}

// Overflows is how many times the socket reported lost notifications.
func (w *Watcher) Overflows() int64 { return w.overflows.Load() }

// Up reports whether the socket is joined to the group now.
func (w *Watcher) Up() bool { return w.up.Load() }

// Run follows the notifications until ctx is done.
func (w *Watcher) Run(ctx context.Context) {
	for {
		err := w.follow(ctx)
		w.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		w.opts.Logf("nftables notifications: %v (resubscribing in %s; every watched table is repaired then)", err, w.opts.Retry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.opts.Retry):
		}
		w.signalAll() // whatever happened meanwhile went unseen
	}
}

// dial opens the socket joined to NFNLGRP_NFTABLES with the receive
// buffer forced to the configured size (SO_RCVBUFFORCE needs
// CAP_NET_ADMIN, which whoever writes nftables has; else as far as
// rmem_max allows).
func (w *Watcher) dial() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: w.opts.NetNS})
	if err != nil {
		return nil, fmt.Errorf("failed to open a netfilter netlink socket: %w", err)
	}
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		c.Close()
		return nil, fmt.Errorf("failed to join the nftables notification group: %w", err)
	}
	raw, err := c.SyscallConn()
	if err == nil {
		var forced error
		err = raw.Control(func(fd uintptr) {
			forced = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, w.opts.ReadBuffer)
		})
		if err == nil && forced != nil {
			err = c.SetReadBuffer(w.opts.ReadBuffer)
		}
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("failed to size the nftables notification socket: %w", err)
	}
	return c, nil
}

// follow reads one socket until it fails or ctx is done.
func (w *Watcher) follow(ctx context.Context) error {
	c, err := w.dial()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		if stop() {
			c.Close()
		}
	}()
	w.up.Store(true)
	w.resetElems() // joined now: what came before went unseen
	for {
		msgs, err := c.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, unix.ENOBUFS) {
				// The kernel dropped notifications; the socket goes on.
				w.overflows.Add(1)
				w.resetElems()
				w.signalAll()
				continue
			}
			return fmt.Errorf("failed to receive nftables notifications: %w", err)
		}
		for _, m := range msgs {
			if ch, ok := Parse(m); ok {
				if ch.Object == Element {
					w.followElems(ch, m)
				}
				w.dispatch(ch)
			}
		}
	}
}

func (w *Watcher) resetElems() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.elems {
		e.reset()
	}
}

// followElems hands the keys of an element notification to the followers
// of its set.
func (w *Watcher) followElems(ch Change, m netlink.Message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var set string
	var keys [][]byte
	parsed := false
	for _, e := range w.elems {
		if e.table != ch.Table {
			continue
		}
		if !parsed {
			set, keys = ElementKeys(m)
			parsed = true
		}
		if slices.Contains(e.sets, set) {
			e.update(keys, ch.Deleted)
		}
	}
}

// Attributes of an element list (NFTA_SET_ELEM_LIST_*), of one element
// (NFTA_SET_ELEM_*) and of a data value (NFTA_DATA_VALUE).
const (
	elemListSet      = 2 // NFTA_SET_ELEM_LIST_SET
	elemListElements = 3 // NFTA_SET_ELEM_LIST_ELEMENTS
	listElem         = 1 // NFTA_LIST_ELEM
	elemKey          = 1 // NFTA_SET_ELEM_KEY
	dataValue        = 1 // NFTA_DATA_VALUE
)

// ElementKeys reads the set name and the elements' keys of one
// NEWSETELEM or DELSETELEM notification (nil keys for another message,
// or one it cannot read).
func ElementKeys(m netlink.Message) (set string, keys [][]byte) {
	if len(m.Data) < 4 {
		return "", nil
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return "", nil
	}
	for ad.Next() {
		switch ad.Type() {
		case elemListSet:
			set = ad.String()
		case elemListElements:
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				eachNested(list, listElem, func(el *netlink.AttributeDecoder) {
					eachNested(el, elemKey, func(k *netlink.AttributeDecoder) {
						for k.Next() {
							if k.Type() == dataValue {
								keys = append(keys, k.Bytes())
							}
						}
					})
				})
				return nil
			})
		}
	}
	if ad.Err() != nil {
		return "", nil
	}
	return set, keys
}

// eachNested calls f with the decoder of each attribute of type typ that
// ad has left.
func eachNested(ad *netlink.AttributeDecoder, typ uint16, f func(*netlink.AttributeDecoder)) {
	for ad.Next() {
		if ad.Type() == typ {
			ad.Nested(func(n *netlink.AttributeDecoder) error { f(n); return nil })
		}
	}
}

func (w *Watcher) dispatch(ch Change) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.subs {
		if s.match(ch) {
			signal(s.out)
		}
	}
}

func (w *Watcher) signalAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.subs {
		signal(s.out)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// objects maps the nf_tables message types that announce a change to the
// object and whether it was deleted. NEWGEN (the end of a transaction)
// and the GET/replies are not changes.
var objects = map[uint16]struct {
	o   Object
	del bool
}{
	unix.NFT_MSG_NEWTABLE: {Table, false}, unix.NFT_MSG_DELTABLE: {Table, true},
	unix.NFT_MSG_NEWCHAIN: {Chain, false}, unix.NFT_MSG_DELCHAIN: {Chain, true},
	unix.NFT_MSG_NEWRULE: {Rule, false}, unix.NFT_MSG_DELRULE: {Rule, true},
	unix.NFT_MSG_NEWSET: {Set, false}, unix.NFT_MSG_DELSET: {Set, true},
	unix.NFT_MSG_NEWSETELEM: {Element, false}, unix.NFT_MSG_DELSETELEM: {Element, true},
	unix.NFT_MSG_NEWOBJ: {StatefulObject, false}, unix.NFT_MSG_DELOBJ: {StatefulObject, true},
	unix.NFT_MSG_NEWFLOWTABLE: {Flowtable, false}, unix.NFT_MSG_DELFLOWTABLE: {Flowtable, true},
}

// tableAttr is the attribute that names the table in every object's
// message (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, ...).
const tableAttr = 1

// Parse reads the Change of one nf_tables notification; ok is false for
// messages that announce no change (another subsystem, NEWGEN) or carry
// no table name.
func Parse(m netlink.Message) (Change, bool) {
	t := uint16(m.Header.Type)
	if t>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return Change{}, false
	}
	kind, ok := objects[t&0xff]
	if !ok || len(m.Data) < 4 {
		return Change{}, false
	}
	ch := Change{Family: m.Data[0], Object: kind.o, Deleted: kind.del}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return Change{}, false
	}
	for ad.Next() {
		if ad.Type() == tableAttr {
			ch.Table = ad.String()
			break
		}
	}
	if ch.Table == "" {
		return Change{}, false
	}
	return ch, true
}
