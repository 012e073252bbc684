package nftwatch_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/nftwatch"
)

func TestParse(t *testing.T) {
	ae := netlink.NewAttributeEncoder()
	ae.String(1, "village_masq")
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msg := func(typ uint16, data []byte) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ)}, Data: data}
	}
	body := append([]byte{unix.NFPROTO_INET, 0, 0, 0}, attrs...)
	for _, c := range []struct {
		name string
		m    netlink.Message
		want nftwatch.Change
		ok   bool
	}{
		{"table deleted", msg(unix.NFT_MSG_DELTABLE, body), nftwatch.Change{Family: unix.NFPROTO_INET, Table: "village_masq", Object: nftwatch.Table, Deleted: true}, true},
		{"rule added", msg(unix.NFT_MSG_NEWRULE, body), nftwatch.Change{Family: unix.NFPROTO_INET, Table: "village_masq", Object: nftwatch.Rule}, true},
		{"element deleted", msg(unix.NFT_MSG_DELSETELEM, body), nftwatch.Change{Family: unix.NFPROTO_INET, Table: "village_masq", Object: nftwatch.Element, Deleted: true}, true},
		{"generation: no change", msg(unix.NFT_MSG_NEWGEN, body), nftwatch.Change{}, false},
		{"another subsystem", netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK<<8 | unix.NFT_MSG_DELTABLE)}, Data: body}, nftwatch.Change{}, false},
		{"no table name", msg(unix.NFT_MSG_DELTABLE, []byte{unix.NFPROTO_INET, 0, 0, 0}), nftwatch.Change{}, false},
		{"truncated", msg(unix.NFT_MSG_DELTABLE, []byte{1}), nftwatch.Change{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := nftwatch.Parse(c.m)
			if ok != c.ok || got != c.want {
				t.Fatalf("Parse = %+v, %v; want %+v, %v", got, ok, c.want, c.ok)
			}
		})
	}
	match := nftwatch.Tables("a", "b")
	for name, want := range map[string]bool{"a": true, "b": true, "c": false, "": false} {
		if got := match(nftwatch.Change{Table: name}); got != want {
			t.Errorf("Tables(a, b) on table %q = %v, want %v", name, got, want)
		}
	}
}

// lab is a namespace with a Watcher running on it; changes records every
// change the watcher saw, watched receives for table "watched".
type lab struct {
	t       *testing.T
	name    string
	w       *nftwatch.Watcher
	watched <-chan struct{}
	mu      sync.Mutex
	changes []nftwatch.Change
}

func newLab(t *testing.T, buffer int) *lab {
	n := testenv.NewNS(t)
	l := &lab{t: t, name: filepath.Base(n.Path())}
	l.w = nftwatch.New(nftwatch.Options{NetNS: int(n.Fd()), ReadBuffer: buffer, Logf: t.Logf})
	l.w.Register(func(c nftwatch.Change) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.changes = append(l.changes, c)
		return false
	})
	l.watched = l.w.Register(nftwatch.Tables("watched"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	l.waitFor("the watcher is subscribed", func() bool { return l.w.Up() })
	return l
}

func (l *lab) nft(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", l.name, "nft"}, args...)...).CombinedOutput(); err != nil {
		l.t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (l *lab) waitFor(what string, f func() bool) {
	l.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			l.t.Fatalf("waiting for %s: still not after 30s; changes seen: %v", what, l.seen())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (l *lab) seen() []nftwatch.Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.changes)
}

func (l *lab) saw(c nftwatch.Change) bool { return slices.Contains(l.seen(), c) }

func (l *lab) drain() {
	select {
	case <-l.watched:
	default:
	}
}

func (l *lab) signalled() bool {
	select {
	case <-l.watched:
		return true
	default:
		return false
	}
}

// TestWatcherReportsNamedTables: in a namespace of its own, the watcher
// sees every kind of change to a table (a table, chain, set, element and
// rule added, then deleted one by one, then the table) and the channel of
// the table's name receives; changes to another table are seen but do not
// signal it.
func TestWatcherReportsNamedTables(t *testing.T) {
	l := newLab(t, 0)
	inet := uint8(unix.NFPROTO_INET)
	l.nft("add", "table", "inet", "other")
	l.waitFor("table other seen", func() bool { return l.saw(nftwatch.Change{Family: inet, Table: "other", Object: nftwatch.Table}) })
	if l.signalled() {
		t.Fatalf("a change to table other signalled the watcher of table watched")
	}
	for _, step := range []struct {
		args []string
		want nftwatch.Change
	}{
		{[]string{"add", "table", "inet", "watched"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Table}},
		{[]string{"add", "chain", "inet", "watched", "c", "{ type filter hook forward priority 0; }"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Chain}},
		{[]string{"add", "set", "inet", "watched", "s", "{ type ipv4_addr; }"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Set}},
		{[]string{"add", "element", "inet", "watched", "s", "{ 10.0.0.1 }"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Element}},
		{[]string{"add", "rule", "inet", "watched", "c", "ip saddr @s drop"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Rule}},
		{[]string{"delete", "element", "inet", "watched", "s", "{ 10.0.0.1 }"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Element, Deleted: true}},
		{[]string{"flush", "chain", "inet", "watched", "c"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Rule, Deleted: true}},
		{[]string{"delete", "chain", "inet", "watched", "c"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Chain, Deleted: true}},
		{[]string{"delete", "table", "inet", "watched"}, nftwatch.Change{Family: inet, Table: "watched", Object: nftwatch.Table, Deleted: true}},
		{[]string{"add", "table", "bridge", "watched"}, nftwatch.Change{Family: unix.NFPROTO_BRIDGE, Table: "watched", Object: nftwatch.Table}},
		{[]string{"flush", "ruleset"}, nftwatch.Change{Family: unix.NFPROTO_BRIDGE, Table: "watched", Object: nftwatch.Table, Deleted: true}},
	} {
		l.drain()
		l.nft(step.args...)
		l.waitFor(step.want.String(), func() bool { return l.saw(step.want) })
		if !l.signalled() {
			t.Fatalf("nft %s: %s seen but the channel of table watched did not receive", strings.Join(step.args, " "), step.want)
		}
	}
}

// TestWatcherOverflowSignals: with a receive buffer of a few KiB, one
// transaction of two thousand rules overflows the socket; the watcher
// counts it, signals every channel (a full repair), and goes on: a later
// deletion is still seen.
func TestWatcherOverflowSignals(t *testing.T) {
	l := newLab(t, 4096)
	var b strings.Builder
	b.WriteString("add table inet other\nadd chain inet other c\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "add rule inet other c ip saddr 10.%d.%d.1 counter accept\n", i/250, i%250)
	}
	file := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	l.drain()
	// The reader may keep up with one batch: the batch again (the table
	// replaced) until the socket overflowed, a bounded number of times.
	for round := 0; l.w.Overflows() == 0; round++ {
		if round == 50 {
			t.Fatalf("50 batches of 2000 rules never overflowed a 4 KiB receive buffer")
		}
		l.nft("-f", file)
		l.nft("delete", "table", "inet", "other")
	}
	if !l.signalled() {
		t.Fatalf("an overflow did not signal the watcher of table watched (only table other changed)")
	}
	l.nft("add", "table", "inet", "watched")
	l.nft("delete", "table", "inet", "watched")
	l.waitFor("the deletion after the overflow", func() bool {
		return l.saw(nftwatch.Change{Family: unix.NFPROTO_INET, Table: "watched", Object: nftwatch.Table, Deleted: true})
	})
}

// TestFollowElements: the followers of a set get the keys of the elements
// added to and deleted from it, each only its own set's; reset runs when
// the socket is joined; and a table deleted whole announces none of its
// elements, so what a follower kept is what the set held then.
func TestFollowElements(t *testing.T) {
	n := testenv.NewNS(t)
	l := &lab{t: t, name: filepath.Base(n.Path())}
	l.w = nftwatch.New(nftwatch.Options{NetNS: int(n.Fd()), Logf: t.Logf})
	var mu sync.Mutex
	sets := map[string]map[string]bool{"s": {}, "other": {}}
	resets := 0
	for set, have := range sets {
		l.w.FollowElements("watched", []string{set}, func(keys [][]byte, deleted bool) {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range keys {
				if deleted {
					delete(have, net.IP(k).String())
				} else {
					have[net.IP(k).String()] = true
				}
			}
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			resets++
		})
	}
	marker := l.w.Register(nftwatch.Tables("marker"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	l.waitFor("the watcher is subscribed", func() bool { return l.w.Up() })
	state := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("s %v other %v resets %d", slices.Sorted(maps.Keys(sets["s"])), slices.Sorted(maps.Keys(sets["other"])), resets)
	}
	l.nft("add", "table", "inet", "watched")
	l.nft("add", "set", "inet", "watched", "s", "{ type ipv4_addr; }")
	l.nft("add", "set", "inet", "watched", "other", "{ type ipv6_addr; }")
	l.nft("add", "element", "inet", "watched", "s", "{ 10.0.0.1, 10.0.0.2 }")
	l.nft("add", "element", "inet", "watched", "other", "{ fd00::9 }")
	want := "s [10.0.0.1 10.0.0.2] other [fd00::9] resets 2"
	l.waitFor(want, func() bool { return state() == want })
	l.nft("delete", "element", "inet", "watched", "s", "{ 10.0.0.1 }")
	want = "s [10.0.0.2] other [fd00::9] resets 2"
	l.waitFor(want, func() bool { return state() == want })
	l.nft("delete", "table", "inet", "watched")
	l.nft("add", "table", "inet", "marker") // seen after the deletion
	l.waitFor("table marker seen", func() bool {
		select {
		case <-marker:
			return true
		default:
			return false
		}
	})
	if got := state(); got != want {
		t.Fatalf("after the table's deletion the followers have %s, want %s (a deleted table announces no element)", got, want)
	}
}
