package landhcp

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/validate"
)

const (
	// acquireTimeout bounds Acquire's DISCOVER..ACK (the plugin's own IPAM
	// deadline is longer, so the plugin gets this error, not its own).
	acquireTimeout = 90 * time.Second
	// exchangeTimeout bounds one renewal, rebinding or rediscovery: the
	// maintainer tries again later (nextAttempt).
	exchangeTimeout = 30 * time.Second
)

// Manager holds the node's LAN pods' leases.
type Manager struct {
	dir  string
	logf func(format string, args ...any)
	ctx  context.Context // the agent's life: maintainers stop with it, releasing nothing
	wg   sync.WaitGroup

	mu     sync.Mutex
	leases map[agentsock.Attachment]*held
}

// held is one lease and the goroutine that keeps it.
type held struct {
	att     agentsock.Attachment
	network string
	id      identity

	mu      sync.Mutex
	lease   *nclient4.Lease
	granted time.Time
	addr    *net.IPNet // the address on the interface; nil once it expired

	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a manager keeping its leases under dir (DefaultDir when
// empty) until ctx ends. Resume picks up the leases a previous agent left.
func New(ctx context.Context, dir string, logf func(format string, args ...any)) *Manager {
	if dir == "" {
		dir = DefaultDir
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Manager{dir: dir, logf: logf, ctx: ctx, leases: map[agentsock.Attachment]*held{}}
}

// Wait returns once every maintainer stopped (after the manager's context
// ended).
func (m *Manager) Wait() { m.wg.Wait() }

// Resume takes over the leases on disk: each whose pod still has its LAN
// interface is renewed from where the previous agent left it (at once when
// its T1 passed meanwhile); the others lapse and their records go. It
// returns how many it resumed.
func (m *Manager) Resume() int {
	recs, bad := loadAll(m.dir)
	for _, err := range bad {
		m.logf("dhcp: %v (left in place)", err)
	}
	n := 0
	for _, r := range recs {
		mac, err := net.ParseMAC(r.MAC)
		if err != nil {
			m.logf("dhcp: lease of %s/%s: MAC %q: %v (left in place)", r.ContainerID, r.IfName, r.MAC, err)
			continue
		}
		l, _ := r.lease() // loadAll checked it
		h := &held{att: r.Attachment, network: r.Network, lease: l, granted: r.Granted, addr: leaseAddr(l.ACK),
			id: identity{Netns: r.Netns, IfName: r.IfName, MAC: mac, ClientID: r.ClientID, Hostname: r.Hostname}}
		if err := h.id.present(); err != nil {
			m.logf("dhcp: lease %s of %s/%s not resumed: %v; it lapses on the server", h.addr, r.ContainerID, r.IfName, err)
			if err := remove(m.dir, r.Attachment); err != nil {
				m.logf("dhcp: %v", err)
			}
			continue
		}
		m.start(h)
		n++
		m.logf("dhcp: resumed lease %s of %s/%s (renewal due %s)", h.addr, r.ContainerID, r.IfName, h.times().Renew.Format(time.RFC3339))
	}
	return n
}

// Handle answers one DHCP request of the agent's socket (op "dhcp").
func (m *Manager) Handle(ctx context.Context, req agentsock.DHCPRequest) (agentsock.DHCPResponse, error) {
	var resp agentsock.DHCPResponse
	var err error
	switch req.Op {
	case agentsock.DHCPStatus:
	case agentsock.DHCPAcquire:
		resp.Lease, err = m.Acquire(ctx, req)
	case agentsock.DHCPRelease:
		err = m.checkAttachment(req.Attachment)
		if err == nil {
			err = m.Release(req.Attachment)
		}
	case agentsock.DHCPCheck:
		resp.Lease, err = m.Check(req.Attachment)
	case agentsock.DHCPGC:
		resp.Released, err = m.GC(req.Network, req.Valid)
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		return agentsock.DHCPResponse{}, fmt.Errorf("DHCP %s of %s/%s: %w", req.Op, req.ContainerID, req.IfName, err)
	}
	return resp, nil
}

func (m *Manager) checkAttachment(a agentsock.Attachment) error {
	if err := validate.ContainerID(a.ContainerID); err != nil {
		return fmt.Errorf("containerID: %w", err)
	}
	if err := validate.LinkName(a.IfName); err != nil {
		return fmt.Errorf("ifName: %w", err)
	}
	return nil
}

// identityOf checks an acquire request and fills its defaults.
func (m *Manager) identityOf(req agentsock.DHCPRequest) (identity, error) {
	if err := m.checkAttachment(req.Attachment); err != nil {
		return identity{}, err
	}
	if !filepath.IsAbs(req.Netns) {
		return identity{}, fmt.Errorf("netns %q: an absolute path is required", req.Netns)
	}
	mac, err := validate.MAC(req.MAC)
	if err != nil {
		return identity{}, fmt.Errorf("mac: %w", err)
	}
	id := identity{Netns: req.Netns, IfName: req.IfName, MAC: mac, Hostname: req.Hostname}
	if req.ClientID != "" {
		if id.ClientID, err = hex.DecodeString(req.ClientID); err != nil || len(id.ClientID) < 2 {
			return identity{}, fmt.Errorf("clientID %q: at least two bytes in hex", req.ClientID)
		}
	} else {
		// RFC 2132 9.14: type 1 (Ethernet) and the hardware address.
		id.ClientID = append([]byte{1}, mac...)
	}
	if len(id.Hostname) > 63 {
		id.Hostname = id.Hostname[:63]
	}
	return id, nil
}

// Acquire gets a lease for the pod interface req names and keeps it. An
// ADD repeated for the same attachment, namespace and MAC gets the lease
// already held.
func (m *Manager) Acquire(ctx context.Context, req agentsock.DHCPRequest) (*agentsock.Lease, error) {
	id, err := m.identityOf(req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	old := m.leases[req.Attachment]
	m.mu.Unlock()
	if old != nil {
		if old.id.Netns == id.Netns && old.id.MAC.String() == id.MAC.String() {
			if w := old.wire(); w != nil {
				return w, nil
			}
		}
		// Another namespace or MAC under the same name: that lease is over.
		if err := m.Release(req.Attachment); err != nil {
			m.logf("dhcp: %v", err)
		}
	}
	if err := id.enterable(); err != nil {
		return nil, fmt.Errorf("no lease for %s on %q: %w", req.ContainerID, req.IfName, err)
	}
	ctx, cancel := context.WithTimeout(ctx, acquireTimeout)
	defer cancel()
	l, err := id.discover(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("no lease for %s on %q (MAC %s) from the LAN's DHCP server: %w", req.ContainerID, req.IfName, id.MAC, err)
	}
	h := &held{att: req.Attachment, network: req.Network, id: id, lease: l, granted: l.CreationTime, addr: leaseAddr(l.ACK)}
	if err := m.persist(h); err != nil {
		_ = id.release(l)
		return nil, err
	}
	m.start(h)
	t := h.times()
	m.logf("dhcp: %s/%s (MAC %s) leased %s from %s until %s (renewal %s)", req.ContainerID, req.IfName, id.MAC, h.addr,
		l.ACK.ServerIdentifier(), t.Expires.Format(time.RFC3339), t.Renew.Format(time.RFC3339))
	return h.wire(), nil
}

// Release stops keeping the attachment's lease and sends DHCPRELEASE; a
// pod already gone cannot send it, and its lease lapses. Releasing what is
// not held succeeds.
func (m *Manager) Release(a agentsock.Attachment) error {
	m.mu.Lock()
	h := m.leases[a]
	delete(m.leases, a)
	m.mu.Unlock()
	if h == nil {
		return remove(m.dir, a)
	}
	h.cancel()
	<-h.done
	h.mu.Lock()
	l, addr := h.lease, h.addr
	h.mu.Unlock()
	if err := h.id.release(l); err != nil {
		m.logf("dhcp: %s/%s: no DHCPRELEASE for %s (%v): the lease lapses on the server", a.ContainerID, a.IfName, addr, err)
	} else {
		m.logf("dhcp: %s/%s released %s", a.ContainerID, a.IfName, leaseAddr(l.ACK))
	}
	return remove(m.dir, a)
}

// Check returns the attachment's lease if it is held and has not expired.
func (m *Manager) Check(a agentsock.Attachment) (*agentsock.Lease, error) {
	m.mu.Lock()
	h := m.leases[a]
	m.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("no lease held for %s/%s", a.ContainerID, a.IfName)
	}
	w := h.wire()
	if w == nil {
		return nil, fmt.Errorf("the lease of %s/%s expired and the LAN's DHCP server has not granted another yet", a.ContainerID, a.IfName)
	}
	return w, nil
}

// GC releases every lease of network whose attachment is not in valid.
func (m *Manager) GC(network string, valid []agentsock.Attachment) (int, error) {
	keep := map[agentsock.Attachment]bool{}
	for _, a := range valid {
		keep[a] = true
	}
	m.mu.Lock()
	var drop []agentsock.Attachment
	for a, h := range m.leases {
		if h.network == network && !keep[a] {
			drop = append(drop, a)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, a := range drop {
		if err := m.Release(a); err != nil {
			errs = append(errs, err)
		}
	}
	return len(drop), errors.Join(errs...)
}

func (m *Manager) persist(h *held) error {
	h.mu.Lock()
	r := &record{Attachment: h.att, Network: h.network, Netns: h.id.Netns, MAC: h.id.MAC.String(), ClientID: h.id.ClientID, Hostname: h.id.Hostname,
		Offer: h.lease.Offer.ToBytes(), ACK: h.lease.ACK.ToBytes(), Granted: h.granted}
	h.mu.Unlock()
	return save(m.dir, r)
}

func (m *Manager) start(h *held) {
	var ctx context.Context
	ctx, h.cancel = context.WithCancel(m.ctx)
	h.done = make(chan struct{})
	m.mu.Lock()
	m.leases[h.att] = h
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(h.done)
		m.maintain(ctx, h)
	}()
}

func (h *held) times() times {
	h.mu.Lock()
	defer h.mu.Unlock()
	return leaseTimes(h.lease.ACK, h.granted)
}

// wire is the lease for the plugin; nil once it expired.
func (h *held) wire() *agentsock.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.addr == nil {
		return nil
	}
	ack := h.lease.ACK
	t := leaseTimes(ack, h.granted)
	w := &agentsock.Lease{Address: h.addr.String(), Server: ack.ServerIdentifier().String(), Domain: ack.DomainName(),
		Renew: t.Renew, Rebind: t.Rebind, Expires: t.Expires}
	if r := ack.Router(); len(r) > 0 {
		w.Gateway = r[0].String()
	}
	for _, d := range ack.DNS() {
		w.DNS = append(w.DNS, d.String())
	}
	return w
}

// maintain keeps h's lease until ctx ends or the pod is gone: it waits for
// the next attempt of the lease's phase and makes it.
func (m *Manager) maintain(ctx context.Context, h *held) {
	last, tried, pause := bound, false, time.Duration(0)
	for {
		t := h.times()
		if p := t.phaseAt(time.Now()); p != last {
			last, tried, pause = p, false, 0
		}
		at, d := t.nextAttempt(time.Now(), tried, pause)
		timer := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		p := t.phaseAt(time.Now())
		if p != last || p == bound {
			continue // a new phase: plan again
		}
		tried, pause = true, d
		err := m.step(ctx, h, p)
		switch {
		case err == nil:
		case errors.Is(err, errPodGone):
			m.logf("dhcp: %s/%s: %v; its lease lapses on the server", h.att.ContainerID, h.att.IfName, err)
			m.forget(h)
			return
		case ctx.Err() != nil:
			return
		default:
			m.logf("dhcp: %s/%s: %s failed: %v", h.att.ContainerID, h.att.IfName, p, err)
		}
	}
}

// forget drops a lease whose pod is gone, without a DHCPRELEASE.
func (m *Manager) forget(h *held) {
	m.mu.Lock()
	if m.leases[h.att] == h {
		delete(m.leases, h.att)
	}
	m.mu.Unlock()
	if err := remove(m.dir, h.att); err != nil {
		m.logf("dhcp: %v", err)
	}
}

// step makes one attempt of phase p: a renewal, a rebinding, or (expired,
// or refused by the server) taking the address off and asking for one.
func (m *Manager) step(ctx context.Context, h *held, p phase) error {
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	h.mu.Lock()
	cur := h.lease
	h.mu.Unlock()
	var next *nclient4.Lease
	var err error
	if p != expired {
		next, err = h.id.extend(ctx, cur, p == renewing)
		var nak *nclient4.ErrNak
		if !errors.As(err, &nak) {
			if err != nil {
				return err
			}
			return m.granted(h, next, p)
		}
		m.logf("dhcp: %s/%s: the server refused to extend %s (%v)", h.att.ContainerID, h.att.IfName, leaseAddr(cur.ACK), err)
	}
	if err := m.unbind(h); err != nil {
		return err
	}
	next, err = h.id.discover(ctx, cur.ACK.YourIPAddr)
	if err != nil {
		return err
	}
	return m.granted(h, next, expired)
}

// unbind takes an expired or refused lease's address off the interface.
func (m *Manager) unbind(h *held) error {
	h.mu.Lock()
	addr := h.addr
	h.mu.Unlock()
	if addr == nil {
		return nil
	}
	if err := h.id.setAddress(addr, nil); err != nil {
		return err
	}
	h.mu.Lock()
	h.addr = nil
	h.mu.Unlock()
	m.logf("dhcp: %s/%s: lease of %s over, address removed from the interface", h.att.ContainerID, h.att.IfName, addr)
	return nil
}

// granted records a lease the server granted in phase p (expired: a new
// DISCOVER), putting its address on the interface when it is not there.
func (m *Manager) granted(h *held, l *nclient4.Lease, p phase) error {
	addr := leaseAddr(l.ACK)
	h.mu.Lock()
	old := h.addr
	h.mu.Unlock()
	if old == nil || old.String() != addr.String() {
		if err := h.id.setAddress(old, addr); err != nil {
			return err
		}
	}
	h.mu.Lock()
	h.lease, h.granted, h.addr = l, l.CreationTime, addr
	h.mu.Unlock()
	t := h.times()
	what := map[phase]string{renewing: "renewed", rebinding: "rebound", expired: "leased again"}[p]
	m.logf("dhcp: %s/%s %s %s until %s (renewal %s)", h.att.ContainerID, h.att.IfName, what, addr,
		t.Expires.Format(time.RFC3339), t.Renew.Format(time.RFC3339))
	return m.persist(h)
}
