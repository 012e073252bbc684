package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"strings"
	"sync"
	"time"

	"github.com/village-cni/village/pkg/landhcp"
	"github.com/village-cni/village/pkg/lanpods"
	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/metrics"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

const (
	// passTimeout bounds one reconcile pass (netlink work only).
	passTimeout = 30 * time.Second
	// settle coalesces a burst of kernel notifications into one repair:
	// long enough for a flush's notifications to arrive together, short
	// against the repair itself.
	settle = 10 * time.Millisecond
	// pathsEvery is how often the agent reads the WireGuard device's
	// handshakes while a peer's path is pending (undecided, or relayed
	// through a hub; see package wireguard's relay.go), and only then.
	// When a direct path starts to work, both ends of the pair see the
	// handshake at once but each moves the pair's subnets at its own next
	// look; meanwhile the end still relaying drops what the other sends
	// it directly (its entry for the peer holds no subnet yet). One second
	// keeps that window short at the price of one device read a second,
	// and none at all without hubs or with every peer direct.
	pathsEvery = time.Second
	// pathsWatchEvery is how often it reads them with hubs but every path
	// direct: a direct session that dies goes through a hub within
	// wireguard.RoamFresh (3 min) and this.
	pathsWatchEvery = 30 * time.Second
	// retryEvery is the pause between attempts at what must succeed before
	// the agent can work (underlay address, subnet lease, registration).
	retryEvery = 2 * time.Second
)

// Run is `villaged run`: it works until ctx is done, then returns nil,
// leaving routes in place and the lease to expire by itself. It returns an
// error only for a configuration that cannot work.
func Run(ctx context.Context, opts Options) error {
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	opts.SafetyNet = opts.safetyNet()
	n, err := openNode(opts)
	if err != nil {
		return err
	}
	defer n.close()
	c, src := n.c, n.src
	if err := c.loadWireGuard(true); err != nil {
		return err
	}
	a := &agent{n: n, c: c, opts: opts, r: n.r, health: newHealth(c.Node), held: map[string]overlay.Node{}}

	// Health from the first second: the probes answer while the agent still
	// waits for its underlay address or pod subnet (/readyz says which). The
	// server stops last, after the loop's goroutines.
	mctx, mcancel := context.WithCancel(ctx)
	var mwg sync.WaitGroup
	defer func() { mcancel(); mwg.Wait() }()
	// WireGuard key rotation (wgrotate.go): the status file from the start.
	if a.rot, err = a.newRotator(mctx); err != nil {
		return err
	}
	// API confinement (confine.go) before anything can write: the probe
	// runs for the process's life, and readiness waits for its proof.
	if c.usesAPI() {
		if side, err := n.kubeSide(); err == nil {
			// The one start of the shared informers: the side took every
			// informer the config turns on when it was made (kube.go), and
			// each feature below adds its handlers to running informers.
			side.start(mctx.Done())
			a.confine = side.conf
			mwg.Go(func() {
				keepConfinement(mctx, side.cs, c.Node, side.conf, func(err error) {
					if werr := writeConfinementStatus(opts.RunDir, c.Net.Name, err); werr != nil {
						opts.logf("recording the API confinement: %v", werr)
					}
				}, opts.logf)
			})
		}
	}
	if opts.MetricsAddr != "" {
		a.m = metrics.New()
		// Traffic per pod, named from the one Pod informer (started with
		// the others below): only where the agent reads the API.
		if c.usesAPI() {
			if side, err := n.kubeSide(); err == nil {
				a.m.WatchPods(c.podTrafficReader(side.pods()))
			}
		}
		mwg.Go(func() {
			if err := a.m.Serve(mctx, opts.MetricsAddr, a.probes()); err != nil && mctx.Err() == nil {
				opts.logf("metrics: %v", err)
			}
		})
	}
	// The node name before anything can ask for an address: village-ipam's
	// etcd and kubernetes stores record the name published here when their
	// block names none (nodelocal.NodeName), so a LAN pool's allocations
	// carry the name this agent registers and reclaims under.
	if err := nodelocal.PublishNodeName(opts.RunDir, c.Net.Name, c.Node); err != nil {
		return fmt.Errorf("publishing the node name of network %s: %w", c.Net.Name, err)
	}
	// The early features (feature.go): the plugin's LAN lookups and DHCP
	// requests on the one agent socket, and the Services on the LAN, from
	// the first second; they need neither the underlay address nor the
	// pod subnet.
	if err := a.start(mctx, &mwg, early); err != nil {
		return err
	}
	if err := netsetup.BridgeNetfilterLoaded(); err != nil {
		opts.logf("warning: %v", err)
	}

	var ip net.IP
	if err := retry(ctx, opts, "finding the underlay address", func() error {
		var err error
		ip, err = n.underlayIP()
		return err
	}); err != nil {
		return nil // stopped while waiting
	}
	// The kept peers (keptpeers.go): with the pod subnets from the
	// config, when the registry's first list is late; with leased ones,
	// only when the registry did not answer for them.
	cidrs := c.PodCIDRs
	a.keptWait = keptAfter
	if len(cidrs) == 0 {
		a.keptWait = -1
		tried := false
		if err := retry(ctx, opts, "taking the pod subnets of node "+c.Node, func() error {
			var err error
			cidrs, err = src.podCIDRs(ctx, true)
			if err != nil && !tried {
				// The registry cannot answer: the subnets this agent
				// published on this boot, and its kept peers at once.
				tried = true
				if p, perr := c.publishedCIDRs(); perr == nil && len(p) > 0 {
					opts.logf("taking the pod subnets of node %s: %v; using %s, published in %s on this boot", c.Node, err, cidrList(p), c.SubnetFile)
					cidrs, a.keptWait = p, 0
					return nil
				}
			}
			return err
		}); err != nil {
			return nil
		}
		changed, err := c.publish(cidrs)
		if err != nil {
			return err
		}
		opts.logf("node %s holds pod subnet %s (published in %s%s)", c.Node, cidrList(cidrs), c.SubnetFile, map[bool]string{false: ", unchanged", true: ""}[changed])
	}
	a.self = n.self(ip, cidrs)
	if opts.PublishConfDir != "" {
		if err := retry(ctx, opts, "publishing the conflist in "+opts.PublishConfDir, func() error {
			published, err := c.publishConf(opts.PublishConfDir, opts.logf)
			if published {
				opts.logf("conflist published as %s: the node can network pods", a.confPath())
			}
			return err
		}); err != nil {
			return nil
		}
	}
	a.health.set(fmt.Errorf("node %s holds pod subnet %s; first reconcile pending", c.Node, cidrList(cidrs)))

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // every goroutine is gone when Run returns

	// The nftables watch before the late features, whose repairs it
	// kicks (nftables.go).
	a.nft = a.newNftWatch()
	a.nft.run(ctx, &wg)
	// The late features (feature.go): NetworkPolicy, the masquerade
	// keeper and the overlay, whose loop runs until ctx is done.
	if err := a.start(ctx, &wg, late); err != nil {
		return err
	}
	<-ctx.Done()
	if c.Backend.Type == netconf.BackendWireGuard {
		opts.logf("stopping: the routes stay, unless the WireGuard device is wireguard-go's: it goes with villaged, and its routes with it; the registration expires after its TTL unless villaged is back")
	} else {
		opts.logf("stopping: routes stay; the registration expires after its TTL unless villaged is back")
	}
	return nil
}

// agent is the run's state. The features set their fields when they
// start, before the goroutines that read them; from then on the loop's
// fields (self, view, the timers' state) are the loop goroutine's alone.
type agent struct {
	n        *node
	c        *Conf
	opts     Options
	r        *overlay.Reconciler
	self     overlay.Node
	view     map[string]overlay.Node // the peers by name: static, then the registry's
	haveView bool                    // a registry list has arrived (or the peers are static, or kept)
	// fromKept says the view is the kept peers (keptpeers.go): the
	// registry's first list is still to come. keptWait is how long the
	// loop waits for that list before it programs them (negative: it
	// does not).
	fromKept bool
	keptWait time.Duration
	m        *metrics.Metrics // nil: metrics off (its methods do nothing)
	health   *health
	// confine is the API confinement proof (confine.go); nil when the
	// agent does not use the Kubernetes API. Set before the probes serve.
	confine *confinement
	reclaim *reclaimer // nil: no registry, or reclaiming is off
	// lease is this node's own etcd registration as keep sees it (nil:
	// no etcd registry); held are the peers whose removal it put in
	// doubt, kept in view (outage.go).
	lease  *leaseWatch
	held   map[string]overlay.Node
	onTick func() // a test's stand-in for the periodic work (nil: the work)
	watch  *kernelWatch
	nft    *nftWatch
	// lan answers the LAN questions (lanside.go); nil without a LAN
	// section. The NetworkPolicy controller asks it which pods have one.
	lan *lanpods.Controller
	// rot rotates the WireGuard key on request and on its period
	// (wgrotate.go); nil for the other backends.
	rot *rotator
	// dhcp is the LAN pods' DHCP client (dhcp.go); nil without DHCP.
	dhcp *landhcp.Manager
	// masq keeps the netfilter rules in its own goroutine
	// (masquerade.go); the loop asks it for passes.
	masq *masqKeeper
	// failed is set when the last full pass failed: the next tick runs
	// one again (see fullDue).
	failed bool
	// sealSwept is set once a pass's seal (seal.go) succeeded: the
	// first one removes a former wireguard backend's seal routes.
	sealSwept bool
	// handedBackAt is the heap's allocation total when the free heap was
	// last handed back (handBack).
	handedBackAt uint64
}

func (a *agent) loop(ctx context.Context, feed *registry.Feed, records chan registry.Node, kernel <-chan struct{}) {
	tick := time.NewTicker(a.opts.Period)
	defer tick.Stop()
	safety := time.NewTimer(jittered(a.opts.safetyNet()))
	defer safety.Stop()
	var settled <-chan time.Time
	var ready <-chan struct{}
	// kept fires once, when the registry's first list is late
	// (keptpeers.go); keep while the kept file lags the view.
	var kept, keep <-chan time.Time
	if feed != nil {
		ready = feed.Ready()
		if a.keptWait >= 0 {
			kept = time.After(a.keptWait)
		}
	}
	bound := liveBound(a.opts.Period)
	var rotate <-chan string
	if a.rot != nil {
		rotate = a.rot.request
	}
	var paths <-chan time.Time // armed only while a WireGuard path is pending
	for {
		a.health.beatNow(bound) // liveness: the loop comes round
		if paths == nil && a.r != nil {
			switch pending, watched := a.r.WireGuardPaths(); {
			case pending:
				paths = time.After(pathsEvery)
			case watched:
				paths = time.After(pathsWatchEvery)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-paths:
			paths = nil
			a.refreshPaths(ctx)
		case <-ready:
			b, ok := feed.Take()
			if !ok {
				continue
			}
			first := !a.haveView || a.fromKept
			a.fromKept, kept = false, nil
			change := a.setView(b)
			hub := a.hubFrom(b)
			if keep == nil && (first || !change.Empty()) {
				keep = time.After(keepEvery) // the kept peers follow the view
			}
			why := fmt.Sprintf("registry revision %d", b.Revision)
			if first {
				a.pass(ctx, why+" (first list: sweep)", false)
				a.masq.keep()
				continue
			}
			if hub {
				a.pass(ctx, why+" (this node's wireguard-hub label changed)", false)
				continue
			}
			a.update(ctx, why, change)
		case <-kernel:
			switch {
			case a.watch != nil && a.watch.urgent.Swap(false):
				settled = nil
				a.repairDrift(ctx, a.watch.take(), records)
			case settled == nil:
				settled = time.After(settle)
			}
		case <-kept:
			kept = nil
			if !a.haveView {
				a.seedKept(ctx)
			}
		case <-keep:
			keep = nil
			a.writeKept()
		case <-settled:
			settled = nil
			a.repairDrift(ctx, a.watch.take(), records)
		case id := <-rotate:
			a.rotateKey("villaged rotate-key", id, records)
		case <-safety.C:
			next := jittered(a.opts.safetyNet())
			safety.Reset(next)
			began := time.Now()
			a.checkSelf(records)
			a.pass(ctx, "safety net", true)
			a.masq.keep()
			// One line every few minutes says the net is there and what
			// it costs (the benchmark finds its passes by it).
			a.opts.logf("safety net: full pass in %s, the next in %s", time.Since(began).Round(time.Millisecond), next.Round(time.Second))
		case <-tick.C:
			if a.onTick != nil {
				a.onTick()
				continue
			}
			if a.releaseHeld() {
				a.pass(ctx, "held peers released", false)
			} else if a.fullDue() {
				a.checkSelf(records)
				a.pass(ctx, "kernel watch incomplete or last pass failed", true)
			}
			if masqOnTick() {
				a.masq.keep()
			}
			if a.rot != nil && a.rot.due(time.Now()) {
				a.rotateKey(fmt.Sprintf("keyRotation %v", a.rot.period), "", records)
			}
			if a.reclaim != nil {
				a.reclaim.pass(ctx)
			}
			a.countAllocations()
			a.handBack()
		}
	}
}

// handBackAfter is how much the agent allocates between two ticks before
// the tick hands the free heap back to the kernel.
const handBackAfter = 4 << 20

// handBack returns the free heap pages to the kernel when the agent has
// allocated handBackAfter since the last time: after a full pass (which
// dumps every route, neighbour and FDB entry and drops them, several times
// what stays live) or a burst of registry events. Left to the runtime, the
// heap stays sized for such a peak (docs/performance.md, "Memory between
// repair passes"); handing it back costs one collection, which a quiet
// tick does not pay.
func (a *agent) handBack() {
	s := []runtimemetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	runtimemetrics.Read(s)
	if s[0].Value.Kind() != runtimemetrics.KindUint64 {
		debug.FreeOSMemory()
		return
	}
	if total := s[0].Value.Uint64(); total-a.handedBackAt >= handBackAfter {
		debug.FreeOSMemory()
		a.handedBackAt = total
	}
}

// setView applies a registry batch to the peer set, logging who came and
// went, and returns the change: for a batch of changes it costs the
// records the batch names, whatever the number of peers.
func (a *agent) setView(b registry.Batch) overlay.PeerChange {
	change, bad := a.n.applyBatch(a.view, b)
	put := make([]string, len(b.Nodes))
	for i, rec := range b.Nodes {
		put[i] = rec.Name
	}
	change = a.holdRemovals(change, put)
	for _, err := range bad {
		a.opts.logf("registry: ignoring a record: %v", err)
	}
	for _, p := range change.Added {
		a.opts.logf("peer %s joined: %s, pods %s", p.Name, p.IP, cidrList(p.PodCIDRs))
	}
	for _, p := range change.Removed {
		a.opts.logf("peer %s left (record deleted or lease expired)", p.Name)
	}
	a.haveView = true
	return change
}

// hubFrom takes this node's hub mark from its own record in b, when b has
// it (the registry's other records are peers: setView), and tells whether
// it changed.
func (a *agent) hubFrom(b registry.Batch) bool {
	for _, rec := range b.Nodes {
		if rec.Name == a.c.Node && rec.Hub != a.self.WireGuardHub {
			a.self.WireGuardHub = rec.Hub
			a.opts.logf("node %s: wireguard hub %v", a.c.Node, rec.Hub)
			return true
		}
	}
	return false
}

// refreshPaths moves WireGuard peers to or from a hub as their handshakes
// now say (overlay.Reconciler.RefreshWireGuardPaths: one read of the
// device, a write only when a path changes). The loop calls it every
// pathsEvery while some peer's path is pending, every pathsWatchEvery
// while there are hubs, and never in a cluster without hubs.
func (a *agent) refreshPaths(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	rep, err := a.r.RefreshWireGuardPaths(pctx)
	for _, ch := range rep.Applied {
		a.opts.logf("wireguard paths: %s", ch)
	}
	if err != nil && ctx.Err() == nil {
		a.opts.logf("wireguard paths: %v", err)
	}
}

// update applies a known change of the peer set without reading the kernel
// (a watch event: a few netlink writes); anything it cannot do that way
// falls back to a full pass. Drift made by hand is the kernel watch's job
// (repairDrift) and the safety net's.
func (a *agent) update(ctx context.Context, why string, change overlay.PeerChange) {
	if change.Empty() {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	start := time.Now()
	rep, err := a.r.Update(pctx, a.self, change)
	if err != nil {
		if !errors.Is(err, overlay.ErrNeedSet) && ctx.Err() == nil {
			a.opts.logf("%s: incremental update: %v; running a full pass", why, err)
		}
		a.pass(ctx, why, false)
		return
	}
	a.m.ObserveReconcile(time.Since(start), nil)
	a.m.SetPeers(len(a.view))
	for _, ch := range rep.Applied {
		a.opts.logf("%s: %s", why, ch)
	}
	a.health.set(nil)
}

// pass reconciles the kernel with the current view, if there is one.
// repair says the pass was not asked for by a change of the view, so
// whatever it has to change is drift.
func (a *agent) pass(ctx context.Context, why string, repair bool) {
	a.repairLocal(why)
	// Before anything else: with no seal, an unrouted pod packet would
	// leave in the clear. The pass goes on (its routes only narrow what
	// leaves); its health reports the failure.
	sealErr := a.c.seal(!a.sealSwept)
	a.sealSwept = sealErr == nil
	if sealErr != nil {
		a.opts.logf("%s: %v", why, sealErr)
	}
	if !a.haveView {
		a.health.set(fmt.Errorf("no peer list from the registry yet"))
		return
	}
	pctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	start := time.Now()
	peers := peerList(a.view)
	rep, err := a.r.Set(pctx, a.self, peers)
	a.m.ObserveReconcile(time.Since(start), err)
	a.m.SetPeers(len(peers))
	if repair {
		a.m.AddDrift(len(rep.Applied)+len(rep.Failed), len(rep.Applied))
	}
	for _, ch := range rep.Applied {
		a.opts.logf("%s: %s", why, ch)
	}
	if err != nil && ctx.Err() == nil {
		a.opts.logf("%s: %d peers: %v", why, len(peers), err)
		a.health.set(fmt.Errorf("last reconcile (%s) failed: %w", why, err))
		a.failed = true // the next tick tries again
		return
	}
	a.failed = sealErr != nil
	a.health.set(sealErr)
}

// repairDrift puts right what the kernel's notifications said drifted:
// the objects they name, one by one against the reconciler's plan
// (overlay.Reconciler.Repair: no planning, no dump), and a full pass when
// they need one (a link or an address changed, someone else's route, more
// objects than the watcher queues) or when Repair cannot judge them alone.
// The node's own objects (repairLocal) follow their own notifications.
func (a *agent) repairDrift(ctx context.Context, d drift, records chan registry.Node) {
	const why = "kernel change"
	if d.local {
		a.repairLocal(why)
	}
	if !d.wide && len(d.objects) == 0 {
		return
	}
	reason := "a link, an address, someone else's route or more objects than the queue holds"
	if !d.wide && a.haveView {
		pctx, cancel := context.WithTimeout(ctx, passTimeout)
		start := time.Now()
		rep, err := a.r.Repair(pctx, d.objects)
		cancel()
		for _, ch := range rep.Applied {
			a.opts.logf("%s: %s", why, ch)
		}
		if err == nil {
			a.m.ObserveReconcile(time.Since(start), nil)
			a.m.AddDrift(len(rep.Applied), len(rep.Applied))
			a.health.set(nil)
			return
		}
		// The entries' notifications of a deleted device come before the
		// device's own: the device first, as for those.
		d.wide = d.wide || errors.Is(err, overlay.ErrDeviceGone)
		reason = err.Error()
	}
	if ctx.Err() == nil {
		a.opts.logf("%s: a full pass: %s", why, reason)
	}
	if d.wide && a.r != nil {
		// The VXLAN device first, on its own: deleted, it took every
		// peer's entries with it, and the full pass that puts them back
		// takes a while at thousands of peers.
		rep, err := a.r.RepairDevice(ctx)
		for _, ch := range rep.Applied {
			a.opts.logf("%s (the VXLAN device first): %s", why, ch)
		}
		if err != nil {
			a.opts.logf("%s (the VXLAN device first): %v", why, err)
		}
	}
	a.checkSelf(records)
	a.pass(ctx, why+" (full pass)", true)
}

// fullDue reports whether a tick is to read the whole kernel back: while
// the kernel watch may have missed a notification (a subscription down, or
// one that ended on a full socket buffer since the last tick), when there
// is no watch, and after a failed pass. Otherwise the notifications and
// the safety net (Options.SafetyNet) cover the kernel, and the tick reads
// none of it.
func (a *agent) fullDue() bool {
	whole := a.watch != nil && a.watch.whole() // asked on every tick: it resets "lost"
	return !whole || a.failed
}

// jittered is d times a random factor between 0.8 and 1.2: the safety
// nets of agents started together drift apart.
func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// masqOnTick reports whether the tick asks the masquerade keeper for a
// pass (masquerade.go): on a host whose iptables is the legacy (x_tables)
// one, whose rules send no notification. Everywhere else the nf_tables
// notifications (nftables.go) and the safety net start its passes.
func masqOnTick() bool { return masq.Detect().Legacy }

// repairLocal is the part of a pass that needs no peer view and reads
// only this node's own few objects: the host shim's routes and the host
// veths' MACs. Every pass runs it, and the kernel watch starts one when a
// notification is about them (kernel.go).
func (a *agent) repairLocal(why string) {
	a.repairShim(why)
	a.repairHostVeths(why)
}

// checkSelf re-reads the underlay address; when it changed, the
// registration follows and the next pass uses it.
func (a *agent) checkSelf(records chan registry.Node) {
	ip, err := a.n.underlayIP()
	if err != nil {
		a.opts.logf("underlay: %v (keeping %s)", err, a.self.IP)
		return
	}
	if ip.Equal(a.self.IP) {
		return
	}
	a.opts.logf("underlay address changed from %s to %s: registering again", a.self.IP, ip)
	a.self.IP = ip
	if records != nil {
		latest(records, record(a.self.Name, ip, a.self.PodCIDRs, a.c.wg))
	}
}

// repairShim puts the host shim's routes of this network back when they are
// missing or carry an old source address (the master's address changed):
// the kernel drops a route whose source address is removed. A shim that no
// ADD has made yet is left unmade.
func (a *agent) repairShim(why string) {
	lan := a.c.Net.LAN
	if lan == nil || !lan.HostShim {
		return
	}
	master, err := macvlan.ResolveMaster(lan.Master)
	if err == nil {
		err = macvlan.RepairShim(master, lan.Ranges, a.c.Net.Name)
	}
	if err != nil {
		a.opts.logf("%s: host shim of network %q: %v", why, a.c.Net.Name, err)
	}
}

// repairHostVeths puts the derived MAC back on this network's host veths
// (Village's owner tag, on its bridge) whose MAC something changed, as udev
// does with MACAddressPolicy=persistent.
func (a *agent) repairHostVeths(why string) {
	ports, err := a.c.bridgePorts()
	if err != nil {
		a.opts.logf("%s: %v", why, err)
		return
	}
	for _, p := range ports {
		if !netsetup.MadeByVillage(p) || bytes.Equal(p.Attrs().HardwareAddr, netsetup.HostVethMAC(p.Attrs().Name)) {
			continue
		}
		was := p.Attrs().HardwareAddr.String()
		if err := netsetup.EnsureHostVethMAC(p); err != nil {
			a.opts.logf("%s: %v", why, err)
			continue
		}
		a.opts.logf("%s: host veth %s MAC %s (was %s)", why, p.Attrs().Name, p.Attrs().HardwareAddr, was)
	}
}

// keep owns this node's registration: it registers (retrying), renews the
// lease every TTL/3, writes the record back when it was deleted by hand,
// registers anew when the lease was lost, and takes new records from
// records. It never revokes the lease.
func keep(ctx context.Context, reg *registry.Registry, n registry.Node, records <-chan registry.Node, m *metrics.Metrics, lease *leaseWatch, logf func(string, ...any)) {
	every := reg.Config().TTL / 3
	var g *registry.Registration
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case n = <-records:
			if g != nil {
				if err := g.Update(ctx, n); err != nil && ctx.Err() == nil {
					logf("updating the registration of node %s: %v", n.Name, err)
				}
			}
			continue
		case <-timer.C:
		}
		next := every
		switch {
		case g == nil:
			var err error
			if g, err = reg.Register(ctx, n); err != nil {
				if ctx.Err() == nil {
					logf("registering node %s: %v (retrying in %s)", n.Name, err, retryEvery)
				}
				next = retryEvery
			} else {
				lease.ok(false)
				logf("registered node %s under lease %x", n.Name, int64(g.Lease()))
			}
		default:
			renewed, err := g.Refresh(ctx)
			if ctx.Err() == nil {
				m.LeaseRenewed(err)
			}
			if err == nil {
				lease.ok(renewed)
			}
			switch {
			case err != nil && ctx.Err() == nil:
				logf("keeping node %s registered: %v (retrying in %s)", n.Name, err, retryEvery)
				next = retryEvery
			case renewed:
				logf("the lease of node %s had expired: registered again under lease %x", n.Name, int64(g.Lease()))
			}
		}
		timer.Reset(next)
	}
}

// latest replaces any unread value of a capacity-1 channel that only the
// caller writes.
func latest[T any](ch chan T, v T) {
	select {
	case <-ch:
	default:
	}
	ch <- v
}

// retry runs f until it succeeds or ctx is done (then it returns ctx's
// error), logging each failure.
func retry(ctx context.Context, opts Options, what string, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		opts.logf("%s: %v (retrying in %s)", what, err, retryEvery)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retryEvery):
		}
	}
}

func cidrList(cidrs []*net.IPNet) string {
	s := make([]string, len(cidrs))
	for i, c := range cidrs {
		s[i] = c.String()
	}
	return strings.Join(s, ",")
}
