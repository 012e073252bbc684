// Package announce makes one node answer for Service addresses on the LAN.
//
// A Service address on the LAN is on no interface of the node: putting it
// on one would let kubelet's and the node's own address detection pick it
// up, and would make the kernel answer for it through every interface,
// the macvlan host shim included. Instead an Announcer answers in user
// space, on the LAN interface alone (the macvlan master):
//
//   - IPv4: ARP requests for a held address get a reply with the
//     interface's MAC (github.com/mdlayher/arp, a packet socket).
//   - IPv6: neighbour solicitations for a held address get a solicited
//     advertisement with the Override flag (github.com/mdlayher/ndp, an
//     ICMPv6 socket filtered to solicitations). The socket joins each
//     held address's solicited-node group, so multicast solicitations
//     reach the interface at all.
//
// Traffic sent to the MAC then reaches the node's stack, where kube-proxy's
// LoadBalancer rules carry it to the endpoints; no address is added.
//
// Before it answers for an address new to its set, an Announcer asks the
// LAN whether anyone else still does (an ARP probe as RFC 5227 makes it, a
// neighbour solicitation), and waits ProbeWait. An answer from another
// MAC means the address is still held elsewhere: the Announcer does not
// take it, and Set reports it contested, to be tried again on a later
// Set. So two nodes whose views of who is alive differ for a moment (a
// starved agent declared dead while it still answers) never answer side
// by side: the address moves only once its holder has let it go.
//
// Conflicts are resolved as RFC 5227 (IPv4 Address Conflict Detection)
// and RFC 4862 5.4 (IPv6 duplicate address detection) say, with the
// timings of ConflictTiming (Config.Conflict):
//
//   - The probe is an ARP request from 0.0.0.0, or a neighbour
//     solicitation from :: with no link-layer option to the address's
//     solicited-node group: it teaches no cache anything.
//   - While probing, any claim from another MAC (an ARP packet with the
//     address as sender, an advertisement of it, a solicitation from it)
//     or another host's probe for the same address (two nodes, or two
//     clusters, probing at the same moment) is a conflict: the address
//     is not taken, and is probed again only after a random delay below
//     RetryJitter, so two probers part; after MaxConflicts, at most once
//     per RateLimitInterval.
//   - Once held, a claim from another MAC is answered with one
//     announcement (defence); a second claim within DefendInterval makes
//     the node yield: it stops answering and reports the address
//     contested (Contested, InUseBy), for the Service's Warning Event and
//     `villaged status`. Claims within DefendGrace of the defence are the
//     same claim (a takeover's burst sends two frames a round, and its
//     sender needs a moment to hear the defence and leave). A probe from
//     another host is no claim: it is answered, which is how the holder
//     defends against a newcomer.
//   - While its takeover burst runs, a node that hears another MAC claim
//     the address leaves it at once, contested: it took the address in a
//     race it lost (its probe's answer came too late to be heard), and
//     the holder it raced against keeps it.
//
// The other nodes of the cluster are no conflict (SetPeers: the LAN MACs
// their Nodes published, from the API server, never from the gossip).
// Which of them answers is the election's to decide, and during a
// hand-back (a node that returns after a failover is elected again, and
// the node that stood in for it lets go once it sees it) the two see each
// other's frames: a peer's answer to a probe means "ask again soon"
// (Set reports ErrHandBack, the speaker asks again within 200 ms), and a
// peer's claim on a held address is neither defended against nor yielded
// to; the node lets go when its own election says so, at once. Only MACs
// that no Node published count as conflicts.
//
// Taking an address over sends a burst of gratuitous ARP, in both the request and the reply form
// (hosts differ in which one they learn from), and unsolicited neighbour
// advertisements to all nodes. While held, each address is announced again
// every Refresh, so a router or switch whose cache outlives its forwarding
// table never blackholes it.
//
// Set is declarative and tolerates repeats: it is handed the whole set of
// addresses this node should answer for, and only the difference acts.
// Deciding which node that is belongs to the caller (the election).
package announce

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Config is what an Announcer is made with.
type Config struct {
	// Interface is the LAN interface (the macvlan master) to answer on.
	Interface string
	// Burst are the delays, from a takeover, of each gratuitous round.
	// Nil means DefaultBurst.
	Burst []time.Duration
	// Refresh is the period of the announcement of every held address.
	// Zero means DefaultRefresh; negative turns it off.
	Refresh time.Duration
	// ProbeWait is how long an address new to the set is probed for
	// before it is taken; zero means DefaultProbeWait.
	ProbeWait time.Duration
	// Conflict holds the timings of conflict resolution; zero fields
	// mean those of DefaultConflictTiming. Tests shorten them here.
	Conflict ConflictTiming
	// OnChange, when set, is called (it must not block) whenever an
	// address is taken, yielded or found contested, so that the caller
	// can report it (the controller's Events) without polling.
	OnChange func()
	// Log receives what the Announcer does; nil means slog.Default.
	Log *slog.Logger
}

// DefaultBurst: five rounds within 2.5 s of a takeover. The first is at
// once; the later ones cover a frame lost while a switch relearns the
// MAC's port, and Linux's ARP locktime (1 s by default): a neighbour
// ignores an ARP update that comes within locktime of the last one for
// the same address, so one round of the burst must come after it.
var DefaultBurst = []time.Duration{0, 200 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond, 2500 * time.Millisecond}

// DefaultProbeWait: an answer on a LAN comes within a millisecond or two;
// the margin is for a loaded holder. The probe is sent twice within it.
const DefaultProbeWait = 150 * time.Millisecond

// DefaultRefresh is well under the common 300 s FDB ageing time of
// switches, so the port of the MAC stays learnt while the address is held.
const DefaultRefresh = 30 * time.Second

// ConflictTiming is the timing of address conflict resolution, after RFC
// 5227 (IPv4 Address Conflict Detection) and RFC 4862 5.4 (IPv6 DAD), in
// one place.
type ConflictTiming struct {
	// DefendInterval (RFC 5227 DEFEND_INTERVAL): a held address is
	// defended once (one announcement) against another MAC; a second
	// conflict within this interval makes the Announcer yield it.
	DefendInterval time.Duration
	// MaxConflicts (RFC 5227 MAX_CONFLICTS): after this many conflicts
	// on an address, none more than twice RateLimitInterval after the
	// one before, it is probed again at most once per RateLimitInterval.
	MaxConflicts int
	// RateLimitInterval (RFC 5227 RATE_LIMIT_INTERVAL).
	RateLimitInterval time.Duration
	// RetryJitter: before MaxConflicts, a contested address is probed
	// again after a random delay below this (RFC 5227 PROBE_WAIT), so
	// two hosts that probed at the same moment do not again.
	RetryJitter time.Duration
	// DefendGrace: claims heard within this of a defence count as the
	// claim defended against, not as a second one. It covers the frames
	// of one takeover round and the time its sender takes to hear the
	// defence and leave.
	DefendGrace time.Duration
}

// DefaultConflictTiming is RFC 5227's.
var DefaultConflictTiming = ConflictTiming{
	DefendInterval:    10 * time.Second,
	MaxConflicts:      10,
	RateLimitInterval: 60 * time.Second,
	RetryJitter:       time.Second,
	DefendGrace:       500 * time.Millisecond,
}

func (t ConflictTiming) withDefaults() ConflictTiming {
	d := DefaultConflictTiming
	if t.DefendInterval == 0 {
		t.DefendInterval = d.DefendInterval
	}
	if t.MaxConflicts == 0 {
		t.MaxConflicts = d.MaxConflicts
	}
	if t.RateLimitInterval == 0 {
		t.RateLimitInterval = d.RateLimitInterval
	}
	if t.RetryJitter == 0 {
		t.RetryJitter = d.RetryJitter
	}
	if t.DefendGrace == 0 {
		t.DefendGrace = d.DefendGrace
	}
	return t
}

// Conflict is an address another MAC answers for, that this node was
// elected for but does not hold.
type Conflict struct {
	Addr      netip.Addr       `json:"addr"`
	MAC       net.HardwareAddr `json:"-"`
	MACText   string           `json:"mac"`
	Last      time.Time        `json:"last"`      // the last conflict
	Conflicts int              `json:"conflicts"` // in a row, none more than 2 RateLimitInterval after the last
	NextProbe time.Time        `json:"nextProbe"` // no probe for it before
}

// Counters are what an Announcer has sent and answered, for metrics and
// tests.
type Counters struct {
	ARPReplies   uint64 // ARP requests answered
	NDPAdverts   uint64 // neighbour solicitations answered
	Contested    uint64 // probes another MAC answered: the address was left to it
	HandBacks    uint64 // probes a peer node answered: asked again later, no conflict
	PeerClaims   uint64 // a peer node's frames naming a held address (claims, probes): left to the election
	Defended     uint64 // announcements sent against another MAC's claim on a held address
	Yielded      uint64 // held addresses left to another MAC that claimed them again, or while taking them
	Probes       uint64 // probes sent
	Gratuitous   uint64 // gratuitous ARP frames sent (both forms count)
	Unsolicited  uint64 // unsolicited neighbour advertisements sent
	SendFailures uint64
}

// Announcer answers ARP and NDP for a set of addresses on one interface.
// Its methods are safe for concurrent use.
type Announcer struct {
	cfg Config
	ifi *net.Interface
	log *slog.Logger

	v4 *arpSide // nil when the interface has no IPv4 address
	v6 *ndpSide // nil when the interface has no IPv6 link-local address

	mu        sync.Mutex
	held      map[netip.Addr]*holding
	conflicts map[netip.Addr]*Conflict // addresses lost to another MAC, kept for the rate limit and reports
	peers     map[string]bool          // the other nodes' LAN MACs (SetPeers), as strings
	counters  Counters
	closed    bool

	// waitEnded, when set (tests), is called after the probes of ip are
	// sent and before the wait for answers ends at deadline.
	waitEnded func(ip netip.Addr, deadline time.Time)

	done chan struct{}
	wg   sync.WaitGroup
}

// holding is one address of the set: probed, then held with its burst
// and refresh timer.
type holding struct {
	cancel   chan struct{}
	held     bool             // probed and taken: answered for
	foreign  chan struct{}    // closed when, while probing, a MAC of no peer node answers, claims or probes it
	by       net.HardwareAddr // that MAC (set under a.mu before foreign is closed)
	peerBy   net.HardwareAddr // a peer node's MAC heard while probing: a hand-back, unless a foreign one was heard too
	taking   time.Time        // the end of the takeover burst: a foreign claim before it makes this node leave
	defended time.Time        // when this node last defended it (zero: never)
}

func newHolding() *holding {
	return &holding{cancel: make(chan struct{}), foreign: make(chan struct{})}
}

// ErrContested: another MAC still answers for the address; it was not
// taken.
var ErrContested = errors.New("another host still answers for it")

// ErrHandBack: another node of the cluster (a peer MAC) still answers for
// the address, which it lets go once it sees this node elected; it was
// not taken now, and no conflict is recorded: ask again soon.
var ErrHandBack = errors.New("another node of the cluster still answers for it (a hand-back in progress)")

// New opens the Announcer's sockets on cfg.Interface, in the network
// namespace of the calling thread (callers in another namespace open it
// inside ns.Do; the sockets stay in that namespace for their life).
func New(cfg Config) (*Announcer, error) {
	if cfg.Burst == nil {
		cfg.Burst = DefaultBurst
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.ProbeWait == 0 {
		cfg.ProbeWait = DefaultProbeWait
	}
	cfg.Conflict = cfg.Conflict.withDefaults()
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("announce: LAN interface %q: %w", cfg.Interface, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("announce: LAN interface %s has no Ethernet address", ifi.Name)
	}
	a := &Announcer{
		cfg:       cfg,
		ifi:       ifi,
		log:       log.With("interface", ifi.Name),
		held:      map[netip.Addr]*holding{},
		conflicts: map[netip.Addr]*Conflict{},
		peers:     map[string]bool{},
		done:      make(chan struct{}),
	}
	has4, hasLL6, err := interfaceFamilies(ifi)
	if err != nil {
		return nil, err
	}
	if has4 {
		if a.v4, err = openARP(ifi); err != nil {
			return nil, err
		}
	}
	if hasLL6 {
		if a.v6, err = openNDP(ifi); err != nil {
			a.closeSockets()
			return nil, err
		}
	}
	if a.v4 != nil {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.serveARP() }()
	}
	if a.v6 != nil {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.serveNDP() }()
	}
	return a, nil
}

// interfaceFamilies says whether ifi has an IPv4 address (ARP needs one
// only as the library's sender address for requests, which the Announcer
// never makes, but an IPv4 LAN without one cannot route a held address
// either) and an IPv6 link-local one (the source of advertisements).
func interfaceFamilies(ifi *net.Interface) (v4, ll6 bool, err error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return false, false, fmt.Errorf("announce: addresses of %s: %w", ifi.Name, err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.Is4():
			v4 = true
		case ip.IsLinkLocalUnicast():
			ll6 = true
		}
	}
	return v4, ll6, nil
}

// ErrFamily: an address of a family the LAN interface cannot answer for.
var ErrFamily = errors.New("the LAN interface has no address of this family")

// Set makes addrs the addresses this node answers for. Addresses new to
// the set are probed for ProbeWait, then taken and announced (the burst),
// unless another MAC answered the probe: then they are left out, and the
// error names them (ErrHandBack for a peer node's MAC, ErrContested for
// any other); a later Set probes them again.
// Addresses no longer in the set stop being answered at once. It
// tolerates repeats: the same set twice does nothing the second time. An
// address of a family the interface cannot serve is refused with
// ErrFamily, and the rest of the set still applies. Set returns when
// every new address is taken or contested.
func (a *Announcer) Set(addrs []netip.Addr) error {
	want := map[netip.Addr]bool{}
	var errs []error
	for _, ip := range addrs {
		ip = ip.Unmap()
		switch {
		case ip.Is4() && a.v4 == nil, ip.Is6() && a.v6 == nil:
			errs = append(errs, fmt.Errorf("announce %s on %s: %w", ip, a.ifi.Name, ErrFamily))
		case !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() || ip.IsLinkLocalUnicast():
			errs = append(errs, fmt.Errorf("announce %s on %s: not a unicast LAN address", ip, a.ifi.Name))
		default:
			want[ip] = true
		}
	}

	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return errors.New("announce: closed")
	}
	// Release before probing: an address this node lets go is not
	// answered by it while it probes others.
	for ip, h := range a.held {
		if want[ip] {
			continue
		}
		close(h.cancel)
		delete(a.held, ip)
		if err := a.leave(ip); err != nil {
			errs = append(errs, err)
		}
		if h.held {
			a.log.Info("no longer answering for address", "address", ip)
		}
	}
	now := time.Now()
	for ip, c := range a.conflicts {
		if !want[ip] && now.Sub(c.Last) > 2*a.cfg.Conflict.RateLimitInterval {
			delete(a.conflicts, ip)
		}
	}
	probing := map[netip.Addr]*holding{}
	for ip := range want {
		if a.held[ip] != nil {
			continue
		}
		if c := a.conflicts[ip]; c != nil && now.Before(c.NextProbe) {
			// Lost to another MAC a moment ago: not probed again before
			// its time (RFC 5227's rate limit after MAX_CONFLICTS).
			errs = append(errs, fmt.Errorf("announce %s on %s: %w (MAC %s; probed again after %s)", ip, a.ifi.Name, ErrContested, c.MAC, c.NextProbe.Format(time.TimeOnly)))
			continue
		}
		h := newHolding()
		a.held[ip] = h
		probing[ip] = h
		if err := a.join(ip); err != nil {
			errs = append(errs, err)
		}
	}
	a.mu.Unlock()

	var wg sync.WaitGroup
	var mu sync.Mutex
	for ip, h := range probing {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.probeThenTake(ip, h); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// probeThenTake asks the LAN for ip twice within ProbeWait and takes it
// unless another MAC answered (or announced or probed it) meanwhile.
func (a *Announcer) probeThenTake(ip netip.Addr, h *holding) error {
	deadline := time.Now().Add(a.cfg.ProbeWait)
	for i := range 2 {
		if i == 1 && !a.waitUntil(time.Now().Add(a.cfg.ProbeWait/2), h) {
			return nil
		}
		if err := a.probe(ip); err != nil {
			a.log.Warn("probing address", "address", ip, "err", err)
		}
	}
	if a.waitEnded != nil {
		a.waitEnded(ip, deadline)
	}
	// A foreign answer ends the wait; a peer's does not, so that a host
	// answering beside a peer during a hand-back is still seen.
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-t.C:
	case <-h.foreign:
	case <-h.cancel:
		return nil
	case <-a.done:
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held[ip] != h {
		return nil // released or replaced meanwhile
	}
	// What was heard decides, not which of the select's ready cases it
	// picked: a wait that ended late (a loaded node) finds the deadline
	// and the answer both ready, and the answer must win.
	switch {
	case h.by != nil:
		delete(a.held, ip)
		_ = a.leave(ip)
		a.counters.Contested++
		c := a.conflictLocked(ip, h.by)
		a.changed()
		return fmt.Errorf("announce %s on %s: %w (MAC %s)", ip, a.ifi.Name, ErrContested, c.MAC)
	case h.peerBy != nil:
		delete(a.held, ip)
		_ = a.leave(ip)
		a.counters.HandBacks++
		return fmt.Errorf("announce %s on %s: %w (node MAC %s)", ip, a.ifi.Name, ErrHandBack, h.peerBy)
	}
	h.held = true
	if n := len(a.cfg.Burst); n > 0 {
		h.taking = time.Now().Add(a.cfg.Burst[n-1])
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.announceLoop(ip, h) }()
	a.log.Info("answering for address", "address", ip)
	a.changed()
	return nil
}

// changed tells the caller that what is held or contested changed.
func (a *Announcer) changed() {
	if a.cfg.OnChange != nil {
		go a.cfg.OnChange()
	}
}

// conflictLocked records a conflict on ip with mac and sets when ip may
// be probed again: after a random delay below RetryJitter, or, once
// MaxConflicts came within RateLimitInterval of each other, after
// RateLimitInterval. a.mu is held.
func (a *Announcer) conflictLocked(ip netip.Addr, mac net.HardwareAddr) *Conflict {
	t := a.cfg.Conflict
	now := time.Now()
	c := a.conflicts[ip]
	// The count restarts only after a quiet spell longer than the rate
	// limit's period: a rate-limited address's conflicts come one
	// interval apart.
	if c == nil || now.Sub(c.Last) > 2*t.RateLimitInterval {
		c = &Conflict{Addr: ip}
		a.conflicts[ip] = c
	}
	c.MAC, c.MACText, c.Last = slices.Clone(mac), mac.String(), now
	c.Conflicts++
	if c.Conflicts >= t.MaxConflicts {
		c.NextProbe = now.Add(t.RateLimitInterval)
	} else {
		c.NextProbe = now.Add(rand.N(t.RetryJitter))
	}
	a.log.Warn("address in use by another host", "address", ip, "mac", c.MACText, "conflicts", c.Conflicts, "nextProbe", c.NextProbe.Format(time.TimeOnly))
	return c
}

// Contested lists the addresses lost to another MAC (while probing, or
// yielded after a defence), sorted; an address taken since is not
// listed.
func (a *Announcer) Contested() []Conflict {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Conflict, 0, len(a.conflicts))
	for ip, c := range a.conflicts {
		if h := a.held[ip]; h != nil && h.held {
			continue
		}
		out = append(out, *c)
	}
	slices.SortFunc(out, func(x, y Conflict) int { return x.Addr.Compare(y.Addr) })
	return out
}

// InUseBy is the MAC that holds ip instead of this node, or nil when ip
// is not contested.
func (a *Announcer) InUseBy(ip netip.Addr) net.HardwareAddr {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h := a.held[ip]; h != nil && h.held {
		return nil
	}
	if c := a.conflicts[ip]; c != nil {
		return c.MAC
	}
	return nil
}

// Holds reports whether this node answers for ip now.
func (a *Announcer) Holds(ip netip.Addr) bool { return a.holds(ip.Unmap()) }

// contest records that mac, not ours, claims ip: it answered or
// announced it, used it as its sender address, or (probe) probed it
// itself.
//
// An address being probed is then left to it (RFC 5227 2.1.1, RFC 4862
// 5.4.3 and 5.4.4; a probe against ours counts: both hosts back off and
// try again after a random delay); when mac is a peer node's, as a
// hand-back, asked again soon and no conflict.
//
// A held address is defended once against a foreign MAC; a second claim
// within DefendInterval, and beyond DefendGrace of the defence, makes this
// node yield it (RFC 5227 2.4 (b)). While its takeover burst runs, the
// first foreign claim makes it leave instead: it raced a holder and lost.
// Another host's probe of a held address is no claim: it is answered. A
// peer node's claim on a held address is left to the election: whichever
// node it picks keeps or lets go, through Set.
func (a *Announcer) contest(ip netip.Addr, mac net.HardwareAddr, probe bool) {
	if macEqual(mac, a.ifi.HardwareAddr) || len(mac) == 0 {
		return
	}
	a.mu.Lock()
	h := a.held[ip]
	if h == nil {
		a.mu.Unlock()
		return
	}
	peer := a.peers[string(mac)]
	switch {
	case !h.held && peer:
		if h.peerBy == nil {
			h.peerBy = slices.Clone(mac)
		}
		a.mu.Unlock()
		return
	case !h.held:
		if h.by == nil {
			h.by = slices.Clone(mac)
			close(h.foreign)
		}
		a.mu.Unlock()
		return
	case peer:
		a.counters.PeerClaims++
		a.mu.Unlock()
		return
	case probe:
		a.mu.Unlock()
		return
	}
	now := time.Now()
	switch {
	case now.Before(h.taking):
		// Claimed while this node sends its takeover burst: another host
		// held it, and its answer to the probe was not heard in time.
		a.yieldLocked(ip, h, mac)
		a.mu.Unlock()
		a.log.Warn("no longer answering for address: another host claimed it while this node took it", "address", ip, "mac", mac.String())
		a.changed()
	case h.defended.IsZero() || now.Sub(h.defended) >= a.cfg.Conflict.DefendInterval:
		h.defended = now
		a.counters.Defended++
		a.mu.Unlock()
		a.log.Warn("defending address against another host", "address", ip, "mac", mac.String())
		a.announce(ip)
	case now.Sub(h.defended) < a.cfg.Conflict.DefendGrace:
		a.mu.Unlock() // the claim just defended against
	default:
		// Claimed again within DefendInterval: yield.
		a.yieldLocked(ip, h, mac)
		a.mu.Unlock()
		a.log.Warn("no longer answering for address: another host claims it", "address", ip, "mac", mac.String())
		a.changed()
	}
}

// yieldLocked stops answering for the held ip, left to mac, and records
// the conflict. a.mu is held.
func (a *Announcer) yieldLocked(ip netip.Addr, h *holding, mac net.HardwareAddr) {
	close(h.cancel)
	delete(a.held, ip)
	_ = a.leave(ip)
	a.counters.Yielded++
	a.conflictLocked(ip, mac)
}

// SetPeers replaces the LAN MACs of the cluster's other nodes (each Node's
// village.cni.io/lan-mac, read from the API server). Their frames are a
// hand-back between nodes, left to the election, never a conflict; a MAC
// not among them is another host's. Conflicts recorded against a MAC that
// is now a peer's (a node heard before its Node published it) are
// dropped: they were a hand-back, and hold up no probe.
func (a *Announcer) SetPeers(macs []net.HardwareAddr) {
	peers := make(map[string]bool, len(macs))
	for _, m := range macs {
		if len(m) == 6 && !macEqual(m, a.ifi.HardwareAddr) {
			peers[string(m)] = true
		}
	}
	a.mu.Lock()
	a.peers = peers
	dropped := false
	for ip, c := range a.conflicts {
		if peers[string(c.MAC)] {
			delete(a.conflicts, ip)
			dropped = true
		}
	}
	a.mu.Unlock()
	if dropped {
		a.changed()
	}
}

// probe asks the LAN once whether anyone answers for ip.
func (a *Announcer) probe(ip netip.Addr) error {
	a.count(func(c *Counters) { c.Probes++ })
	if ip.Is4() {
		return a.v4.probe(ip)
	}
	return a.v6.probe(ip)
}

// Held lists the addresses this node answers for, sorted.
func (a *Announcer) Held() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]netip.Addr, 0, len(a.held))
	for ip, h := range a.held {
		if h.held {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Counters returns what the Announcer has done so far.
func (a *Announcer) Counters() Counters {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counters
}

// HardwareAddr is the MAC the Announcer answers with.
func (a *Announcer) HardwareAddr() net.HardwareAddr { return a.ifi.HardwareAddr }

// Close stops answering for every address and closes the sockets.
func (a *Announcer) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	for ip, h := range a.held {
		close(h.cancel)
		delete(a.held, ip)
	}
	close(a.done)
	a.mu.Unlock()
	err := a.closeSockets()
	a.wg.Wait()
	return err
}

func (a *Announcer) closeSockets() error {
	var errs []error
	if a.v4 != nil {
		errs = append(errs, a.v4.close())
	}
	if a.v6 != nil {
		errs = append(errs, a.v6.close())
	}
	return errors.Join(errs...)
}

// holds reports whether ip is held (probed and taken) now.
func (a *Announcer) holds(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.held[ip]
	return h != nil && h.held
}

// count adds to the counters under the lock.
func (a *Announcer) count(f func(*Counters)) {
	a.mu.Lock()
	f(&a.counters)
	a.mu.Unlock()
}

// announceLoop sends the takeover burst for ip, then a refresh every
// Refresh until h is cancelled.
func (a *Announcer) announceLoop(ip netip.Addr, h *holding) {
	start := time.Now()
	for _, d := range a.cfg.Burst {
		if !a.waitUntil(start.Add(d), h) {
			return
		}
		a.announce(ip)
	}
	if a.cfg.Refresh < 0 {
		return
	}
	t := time.NewTicker(a.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			a.announce(ip)
		case <-h.cancel:
			return
		case <-a.done:
			return
		}
	}
}

// waitUntil waits for at, and reports false when h or the Announcer ended
// first.
func (a *Announcer) waitUntil(at time.Time, h *holding) bool {
	d := time.Until(at)
	if d <= 0 {
		select {
		case <-h.cancel:
			return false
		case <-a.done:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-h.cancel:
		return false
	case <-a.done:
		return false
	}
}

// announce sends one unsolicited announcement of ip.
func (a *Announcer) announce(ip netip.Addr) {
	var err error
	if ip.Is4() {
		err = a.v4.gratuitous(ip)
		if err == nil {
			a.count(func(c *Counters) { c.Gratuitous += 2 })
		}
	} else {
		err = a.v6.unsolicited(ip)
		if err == nil {
			a.count(func(c *Counters) { c.Unsolicited++ })
		}
	}
	if err != nil {
		a.count(func(c *Counters) { c.SendFailures++ })
		a.log.Warn("announcing address", "address", ip, "err", err)
	}
}

func (a *Announcer) join(ip netip.Addr) error {
	if ip.Is6() {
		return a.v6.join(ip)
	}
	return nil
}

func (a *Announcer) leave(ip netip.Addr) error {
	if ip.Is6() {
		return a.v6.leave(ip)
	}
	return nil
}
