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
// Taking an address over (Set adding it, or the interface coming back up)
// sends a burst of gratuitous ARP, in both the request and the reply form
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
	// Log receives what the Announcer does; nil means slog.Default.
	Log *slog.Logger
}

// DefaultBurst: five rounds within 2.5 s of a takeover. The first is at
// once; the later ones cover a frame lost while a switch relearns the
// MAC's port, and Linux's ARP locktime (1 s by default): a neighbour
// ignores an ARP update that comes within locktime of the last one for
// the same address, so one round of the burst must come after it.
var DefaultBurst = []time.Duration{0, 200 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond, 2500 * time.Millisecond}

// DefaultRefresh is well under the common 300 s FDB ageing time of
// switches, so the port of the MAC stays learnt while the address is held.
const DefaultRefresh = 30 * time.Second

// Counters are what an Announcer has sent and answered, for metrics and
// tests.
type Counters struct {
	ARPReplies   uint64 // ARP requests answered
	NDPAdverts   uint64 // neighbour solicitations answered
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

	mu       sync.Mutex
	held     map[netip.Addr]*holding
	counters Counters
	closed   bool

	done chan struct{}
	wg   sync.WaitGroup
}

// holding is one held address: its burst and refresh timer.
type holding struct {
	cancel chan struct{}
}

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
		cfg:  cfg,
		ifi:  ifi,
		log:  log.With("interface", ifi.Name),
		held: map[netip.Addr]*holding{},
		done: make(chan struct{}),
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
// the set are announced at once (the burst); addresses no longer in it
// stop being answered. It tolerates repeats: the same set twice does
// nothing the second time. An address of a family the interface cannot
// serve is refused with ErrFamily, and the rest of the set still applies.
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
	defer a.mu.Unlock()
	if a.closed {
		return errors.New("announce: closed")
	}
	// Add before delete: a move between two addresses never leaves a
	// moment with neither answered.
	for ip := range want {
		if a.held[ip] != nil {
			continue
		}
		h := &holding{cancel: make(chan struct{})}
		a.held[ip] = h
		if err := a.join(ip); err != nil {
			errs = append(errs, err)
		}
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.announceLoop(ip, h) }()
		a.log.Info("answering for address", "address", ip)
	}
	for ip, h := range a.held {
		if want[ip] {
			continue
		}
		close(h.cancel)
		delete(a.held, ip)
		if err := a.leave(ip); err != nil {
			errs = append(errs, err)
		}
		a.log.Info("no longer answering for address", "address", ip)
	}
	return errors.Join(errs...)
}

// Held lists the addresses this node answers for, sorted.
func (a *Announcer) Held() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]netip.Addr, 0, len(a.held))
	for ip := range a.held {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Reannounce sends the takeover burst for every held address again: after
// the LAN interface came back up, the LAN may have learnt another node's
// MAC for them meanwhile.
func (a *Announcer) Reannounce() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ip, h := range a.held {
		close(h.cancel)
		nh := &holding{cancel: make(chan struct{})}
		a.held[ip] = nh
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.announceLoop(ip, nh) }()
	}
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

// holds reports whether ip is held now.
func (a *Announcer) holds(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[ip] != nil
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
