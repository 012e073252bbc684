package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/nftwatch"
	"github.com/village-cni/village/pkg/overlay"
)

// The repair phases of BenchmarkControlPlaneVsFlannel, after its idle
// phase: objects each agent keeps in its node namespace are deleted by
// hand, one at a time, and the benchmark times each one's return from the
// notifications of its own watch (routes, neighbour and FDB entries,
// links, nf_tables tables); then the storms: 1,000 routes deleted at
// once, and villaged's masquerade table deleted ten times a second.

var (
	// cpRepairs is the samples per kind (VILLAGE_BENCH_REPAIRS, default 20;
	// the VTEP, whose deletion takes every peer's entries with it, at most 5).
	cpRepairs = 20
	// cpStorm is how long the masquerade table is deleted ten times a
	// second (VILLAGE_BENCH_STORM, default 60 s).
	cpStorm = 60 * time.Second
)

// cpNever is how long a deleted object is waited for before the benchmark
// calls it "never" back (flanneld repairs few of them;
// VILLAGE_BENCH_NEVER, default 30 s).
var cpNever = 30 * time.Second

// watchRepairs adds what the repair phases wait for to w's watch: links
// ("L name" made or changed, "DL name" removed) and nf_tables tables
// ("T name" made, "DT name" removed).
func (w *cpWatcher) watchRepairs(b *testing.B, h netns.NsHandle, done chan struct{}, onErr func(string) func(error)) {
	links := make(chan netlink.LinkUpdate, 1<<12)
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &h, ErrorCallback: onErr("link")}); err != nil {
		b.Fatal(err)
	}
	go func() {
		for u := range links {
			now := time.Now()
			switch u.Header.Type {
			case unix.RTM_NEWLINK:
				w.mark("L "+u.Attrs().Name, now)
			case unix.RTM_DELLINK:
				w.mark("DL "+u.Attrs().Name, now)
			}
		}
	}()
	nw := nftwatch.New(nftwatch.Options{NetNS: int(h), ReadBuffer: 1 << 24})
	// The match runs in the watcher's goroutine as each notification is
	// read: the time it is called is the notification's.
	nw.Register(func(c nftwatch.Change) bool {
		if c.Object == nftwatch.Table {
			k := "T "
			if c.Deleted {
				k = "DT "
			}
			w.mark(k+c.Table, time.Now())
		}
		return false
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-done; cancel() }()
	go nw.Run(ctx)
}

// cpHands is what the repair phases need of one watcher's namespace.
type cpHands struct {
	w    *cpWatcher
	nsh  netns.NsHandle
	h    *netlink.Handle
	vtep netlink.Link // nil for host-gw
	masq string       // the inet table of the masquerade rules ("": none)
}

func cpHandsOf(b *testing.B, w *cpWatcher, mode string) *cpHands {
	nsh, err := netns.GetFromPath(w.ns.NS.Path())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nsh.Close() })
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Close)
	hs := &cpHands{w: w, nsh: nsh, h: h}
	if mode == "vxlan" {
		links, err := h.LinkList()
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range links {
			if l.Type() == "vxlan" {
				hs.vtep = l
			}
		}
		if hs.vtep == nil {
			b.Fatalf("%s: no vxlan device in its namespace", w.name)
		}
	}
	out, err := exec.Command("ip", "netns", "exec", w.ns.Name(), "nft", "list", "tables").CombinedOutput()
	if err != nil {
		b.Fatalf("%s: nft list tables: %v: %s", w.name, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		// villaged's masquerade table; flanneld's would be its own (it
		// runs with --ip-masq=false here, as in every round: none).
		if f := strings.Fields(l); len(f) == 3 && f[1] == "inet" && strings.HasPrefix(f[2], "village-") {
			hs.masq = f[2]
		}
	}
	return hs
}

// cpKind is one kind of object the repair phase deletes.
type cpKind struct {
	name string
	max  int // samples at most (0: cpRepairs)
	// del deletes peer i's object and returns the notification key that
	// says it is back and the deletion's time; skip says this watcher has
	// no such object.
	del  func(hs *cpHands, i int) (key string, t0 time.Time, err error)
	skip func(hs *cpHands) string
}

func cpKinds(mode string, nodes int) []cpKind {
	keys := func(i int) []string { return cpKeys(mode, i, 0) }
	kinds := []cpKind{{name: "route", del: func(hs *cpHands, i int) (string, time.Time, error) {
		_, dst, _ := net.ParseCIDR(cpCIDR(i))
		t0 := time.Now()
		return keys(i)[0], t0, hs.h.RouteDel(&netlink.Route{Dst: dst})
	}}}
	if mode == "vxlan" {
		kinds = append(kinds,
			cpKind{name: "neighbour", del: func(hs *cpHands, i int) (string, time.Time, error) {
				vtep := net.ParseIP(strings.TrimSuffix(cpCIDR(i), ".0/24") + ".0")
				t0 := time.Now()
				return keys(i)[1], t0, hs.h.NeighDel(&netlink.Neigh{LinkIndex: hs.vtep.Attrs().Index, Family: unix.AF_INET, IP: vtep})
			}},
			cpKind{name: "FDB entry", del: func(hs *cpHands, i int) (string, time.Time, error) {
				ip := net.ParseIP(cpIP(i, 0))
				t0 := time.Now()
				return keys(i)[2], t0, hs.h.NeighDel(&netlink.Neigh{LinkIndex: hs.vtep.Attrs().Index, Family: unix.AF_BRIDGE,
					HardwareAddr: overlay.DeriveMAC(ip), IP: ip, Flags: netlink.NTF_SELF})
			}})
	}
	kinds = append(kinds, cpKind{name: "masquerade table",
		skip: func(hs *cpHands) string {
			if hs.masq == "" {
				return "none (no masquerade table of its own)"
			}
			return ""
		},
		del: func(hs *cpHands, i int) (string, time.Time, error) {
			t0, err := hs.deleteMasq()
			return "T " + hs.masq, t0, err
		}})
	return kinds
}

// deleteMasq deletes the masquerade table (`nft delete table inet …`,
// over netlink from here: an nft command's exec would add its start to
// the figure) and returns the time the request was sent.
func (hs *cpHands) deleteMasq() (time.Time, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(hs.nsh)))
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: nftables: %w", hs.w.name, err)
	}
	defer c.CloseLasting()
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: hs.masq})
	t0 := time.Now()
	if err := c.Flush(); err != nil {
		return t0, fmt.Errorf("%s: deleting table inet %s: %w", hs.w.name, hs.masq, err)
	}
	return t0, nil
}

// cpRepairPhase deletes each kind of object cpRepairs times in each
// watcher's namespace (the watchers side by side, one object at a time
// each) and reports the time to its return; a watcher that has not put
// one back within cpNever is "never" for that kind and is not asked again.
// Peers are taken from the middle of the list (the first 100 moved, the
// last 100 are gone), each kind its own, so a never-repaired object of
// one kind is not in the way of the next.
func cpRepairPhase(b *testing.B, hands []*cpHands, mode string, nodes int) {
	base := cpChanged
	for _, kind := range cpKinds(mode, nodes) {
		n := cpRepairs
		if kind.max > 0 && kind.max < n {
			n = kind.max
		}
		if base+n > nodes-cpChanged {
			b.Fatalf("%d nodes are too few for the repair phase", nodes)
		}
		var wg sync.WaitGroup
		lines := make([]string, len(hands))
		for k, hs := range hands {
			wg.Go(func() {
				if kind.skip != nil {
					if why := kind.skip(hs); why != "" {
						lines[k] = fmt.Sprintf("%s %s", hs.w.name, why)
						return
					}
				}
				var lat []time.Duration
				began := time.Now()
				for s := range n {
					if time.Since(began) > 2*cpNever {
						break // a slow repairer (flanneld's periodic one): fewer samples
					}
					key, t0, err := kind.del(hs, base+s)
					if err != nil {
						b.Errorf("%s: deleting the %s of peer %d: %v", hs.w.name, kind.name, base+s, err)
						break
					}
					back, ok := hs.w.after(key, t0, t0.Add(cpNever))
					if !ok {
						lines[k] = fmt.Sprintf("%s never (not back within %s; %d of %d samples back before)", hs.w.name, cpNever, len(lat), s+1)
						return
					}
					lat = append(lat, back.Sub(t0))
				}
				slices.Sort(lat)
				lines[k] = fmt.Sprintf("%s p50 %s p99 %s max %s (n=%d)", hs.w.name, pctMicro(lat, 50), pctMicro(lat, 99), pctMicro(lat, 100), len(lat))
			})
		}
		wg.Wait()
		b.Logf("FIGURE: %s %d nodes, repair of a deleted %s (deletion to the object's notification): %s; load %s",
			mode, nodes, kind.name, strings.Join(lines, "; "), loadAvg())
		base += n
	}
}

// cpVTEPPhase deletes the VTEP (vxlan only) in each namespace, up to 5 times,
// and reports when the device is back and when every peer's route
// through it is back. Each sample starts once the agent's CPU time has
// stopped growing (the last sample's pass is over). One namespace after
// the other: the kernel's RTNL
// lock is global, so a deletion in the other agent's namespace at the
// same time (tens of milliseconds under the lock, for thousands of
// entries) would hold up this one's new device and be in its figure.
func cpVTEPPhase(b *testing.B, hands []*cpHands, mode string, nodes int) {
	peers := make([]int, 0, nodes)
	for i := cpChanged; i < nodes-cpChanged; i++ {
		peers = append(peers, i)
	}
	lines := make([]string, len(hands))
	for k, hs := range hands {
		func() {
			var link, all, since, call []time.Duration
			for s := range min(cpRepairs, 5) {
				// The last sample's full pass (every peer's entries
				// written, then logged) has ended: this one's repair is
				// not queued behind it.
				cpuSettled(b, hs.w.cmd.Process.Pid)
				name := hs.vtep.Attrs().Name
				l, err := hs.h.LinkByName(name)
				if err != nil {
					b.Errorf("%s: %s: %v", hs.w.name, name, err)
					return
				}
				t0 := time.Now()
				if err := hs.h.LinkDel(l); err != nil {
					b.Errorf("%s: deleting %s: %v", hs.w.name, name, err)
					return
				}
				took := time.Since(t0) // the kernel drops every entry with it
				// The device goes down before it goes (a notification of
				// its own): it is back at the first one after its removal.
				gone, ok := hs.w.after("DL "+name, t0, t0.Add(cpNever))
				if !ok {
					b.Errorf("%s: no notification of %s removed", hs.w.name, name)
					return
				}
				back, ok := hs.w.after("L "+name, gone, t0.Add(cpNever))
				if !ok {
					lines[k] = fmt.Sprintf("%s never (device not back within %s; %d of %d samples back before)", hs.w.name, cpNever, len(link), s+1)
					return
				}
				last := back
				for _, i := range peers {
					t, ok := hs.w.after(cpKeys(mode, i, 0)[0], t0, t0.Add(cpNever))
					if !ok {
						lines[k] = fmt.Sprintf("%s device back in %s (%s from the removal's notification; the deletion call took %s), but peer %d's route not within %s",
							hs.w.name, back.Sub(t0).Round(time.Millisecond), back.Sub(gone).Round(time.Millisecond), took.Round(time.Millisecond), i, cpNever)
						return
					}
					last = maxTime(last, t)
				}
				link, all = append(link, back.Sub(t0)), append(all, last.Sub(t0))
				since, call = append(since, back.Sub(gone)), append(call, took)
			}
			for _, s := range [][]time.Duration{link, all, since, call} {
				slices.Sort(s)
			}
			lines[k] = fmt.Sprintf("%s device p50 %s max %s (from the removal's notification p50 %s max %s; the deletion call took p50 %s), every route (%d) p50 %s max %s (n=%d)",
				hs.w.name, pctMicro(link, 50), pctMicro(link, 100), pctMicro(since, 50), pctMicro(since, 100), pctMicro(call, 50),
				len(peers), pctMicro(all, 50), pctMicro(all, 100), len(link))
		}()
	}
	b.Logf("FIGURE: %s %d nodes, repair of the deleted VTEP: %s; load %s", mode, nodes, strings.Join(lines, "; "), loadAvg())
}

// cpRouteStorm deletes up to 1,000 peers' routes at once in each
// namespace and reports when all are back.
func cpRouteStorm(b *testing.B, hands []*cpHands, mode string, nodes int) {
	count := min(1000, nodes-2*cpChanged)
	var wg sync.WaitGroup
	lines := make([]string, len(hands))
	for k, hs := range hands {
		wg.Go(func() {
			t0s := make([]time.Time, count)
			start := time.Now()
			for s := range count {
				_, dst, _ := net.ParseCIDR(cpCIDR(cpChanged + s))
				t0s[s] = time.Now()
				_ = hs.h.RouteDel(&netlink.Route{Dst: dst}) // a route flanneld never put back is already gone
			}
			deleted := time.Since(start)
			var lat []time.Duration
			last := start
			for s := range count {
				t, ok := hs.w.after(cpKeys(mode, cpChanged+s, 0)[0], t0s[s], start.Add(cpNever))
				if !ok {
					continue
				}
				lat = append(lat, t.Sub(t0s[s]))
				last = maxTime(last, t)
			}
			if len(lat) < count {
				lines[k] = fmt.Sprintf("%s never (%d of %d back within %s)", hs.w.name, len(lat), count, cpNever)
				return
			}
			slices.Sort(lat)
			lines[k] = fmt.Sprintf("%s all back %s after the first deletion (deleting took %s), each p50 %s p99 %s max %s",
				hs.w.name, last.Sub(start).Round(time.Millisecond), deleted.Round(time.Millisecond), pctMicro(lat, 50), pctMicro(lat, 99), pctMicro(lat, 100))
		})
	}
	wg.Wait()
	b.Logf("FIGURE: %s %d nodes, storm of %d routes deleted at once: %s; load %s", mode, nodes, count, strings.Join(lines, "; "), loadAvg())
}

// cpMasqStorm deletes each watcher's masquerade table ten times a second
// for cpStorm and reports the agent's CPU over the storm and over as long
// again after it (a notification loop would go on), how many deletions
// found the table back, and the table's return after the last one.
func cpMasqStorm(b *testing.B, hands []*cpHands, mode string, nodes int) {
	for _, hs := range hands {
		if hs.masq == "" {
			b.Logf("FIGURE: %s %d nodes, masquerade table deleted 10/s for %s: %s none (no masquerade table of its own)", mode, nodes, cpStorm, hs.w.name)
			continue
		}
		pid := hs.w.cmd.Process.Pid
		cpu0, t0 := cpuTime(b, pid), time.Now()
		tick := time.NewTicker(100 * time.Millisecond)
		tries, found := 0, 0
		var lastDel time.Time
		for time.Since(t0) < cpStorm {
			<-tick.C
			tries++
			if t, err := hs.deleteMasq(); err == nil {
				found++
				lastDel = t
			}
		}
		tick.Stop()
		storm, el := cpuTime(b, pid)-cpu0, time.Since(t0)
		back := "not back within " + cpNever.String()
		if t, ok := hs.w.after("T "+hs.masq, lastDel, time.Now().Add(cpNever)); ok {
			back = "back " + t.Sub(lastDel).Round(time.Millisecond).String() + " after the last deletion"
		}
		cpu1, t1 := cpuTime(b, pid), time.Now()
		time.Sleep(min(cpStorm, 20*time.Second))
		after, el1 := cpuTime(b, pid)-cpu1, time.Since(t1)
		b.Logf("FIGURE: %s %d nodes, masquerade table deleted 10/s for %s: %s CPU %s (%.1f%% of one core), %d of %d deletions found the table back, %s; CPU over the %s after %s (%.1f%%); load %s",
			mode, nodes, el.Round(time.Second), hs.w.name, storm.Round(time.Millisecond), 100*storm.Seconds()/el.Seconds(), found, tries, back,
			el1.Round(time.Second), after.Round(time.Millisecond), 100*after.Seconds()/el1.Seconds(), loadAvg())
	}
}

// cpSafetyNets counts villaged's safety-net passes logged in its log past
// offset (the log's size when the window began).
func cpSafetyNets(path string, offset int64) (int, []string) {
	raw, err := os.ReadFile(path)
	if err != nil || int64(len(raw)) < offset {
		return 0, nil
	}
	var lines []string
	for _, l := range strings.Split(string(raw[offset:]), "\n") {
		if strings.Contains(l, "safety net: full pass") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return len(lines), lines
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// pctMicro is pct to the tenth of a millisecond (repairs take a few).
func pctMicro(lat []time.Duration, p int) time.Duration { return pctTo(lat, p, 100*time.Microsecond) }
