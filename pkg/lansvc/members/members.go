// Package members tells a node agent which agents are alive on the LAN,
// without the API server on the path.
//
// The agents gossip with github.com/hashicorp/memberlist (SWIM with
// Lifeguard's refinements, as MetalLB's speakers do) over the LAN, each
// bound to its node's LAN address. The timings are tuned for a LAN of a
// few nodes where an address must move within about a second: a probe
// every 100 ms, 50 ms to answer, suspicion for 2 probe periods (up to 6
// while no other member confirms), gossip every 50 ms. Lifeguard's local
// health backs a starved agent's probing off instead of letting it
// declare healthy peers dead.
//
// memberlist probes only members it believes alive; a node that dropped
// off the LAN and came back would stay dead in everyone's view. So the
// agent keeps joining every known peer address that is not alive, every
// Rejoin period; a join is one TCP push-pull exchange.
//
// Settled says whether this agent's view can be trusted to claim
// addresses: after the agent starts, and after a Reset (the speaker calls
// it whenever the LAN interface goes down or up), it waits Settle after
// its first successful exchange with a peer. Meanwhile the node that
// holds an address keeps it, so a returning node never answers beside the
// current holder: a gap of at most Settle, never two MACs. A node that
// no peer answers for Alone after its start, a Reset, or learning a new
// peer address (SetPeers) settles by itself:
// its peers are down (the other node of a two-node cluster died, or every
// other node is off), and it must answer for them. Losing every peer once
// settled does not unsettle a node either: in a two-node cluster that is
// exactly when the survivor must keep answering. A node that is merely
// cut off is kept from answering beside a holder it can hear by the
// announcer's probe before it takes an address.
package members

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// DefaultPort is the UDP and TCP port of the agents' gossip. It is not
// MetalLB's 7946, so both can run on one node.
const DefaultPort = 7947

// Config is what Start needs.
type Config struct {
	// Name is this node's name (the Kubernetes Node name).
	Name string
	// Addr is this node's LAN address; the agent listens there only.
	Addr netip.Addr
	// Port is the gossip port; 0 means DefaultPort.
	Port int
	// Peers are the other agents' LAN addresses ("addr" or "addr:port").
	// SetPeers replaces them later.
	Peers []string
	// Key, when set, is the shared AES key (16, 24 or 32 bytes) that
	// encrypts and authenticates the gossip.
	Key []byte
	// Settle is how long after (re)joining before Settled is true;
	// 0 means DefaultSettle.
	Settle time.Duration
	// Rejoin is the period of joining known peers that are not alive;
	// 0 means DefaultRejoin.
	Rejoin time.Duration
	// Alone is how long after its start or a Reset a node with peers,
	// none of which answers, waits before it settles by itself; 0 means
	// DefaultAlone.
	Alone time.Duration
	// OnChange is called, from the gossip's goroutine, whenever a member
	// joins, leaves, fails, or Settled turns true. It must not block.
	OnChange func()
	// Dial opens the TCP connections of joins and state exchanges; nil
	// means net.Dialer. A seam for tests whose nodes are namespaces: the
	// gossip's own sockets are made in the namespace Start runs in, but
	// a dial would run in whatever namespace its thread is in.
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// Log receives the gossip's own log lines at debug level; nil means
	// slog.Default.
	Log *slog.Logger
	// MaxMembers bounds the members this agent keeps (besides itself);
	// 0 means DefaultMaxMembers. Beyond it a new name is refused, and a
	// known Node pushes out a member that is none, else the oldest.
	MaxMembers int
}

// DefaultMaxMembers is far above the nodes of a LAN, and keeps a host
// that joins under ever new names from growing the map without bound.
const DefaultMaxMembers = 256

// Timings of the gossip; see the package comment.
const (
	DefaultSettle = time.Second
	DefaultRejoin = 500 * time.Millisecond
	DefaultAlone  = 3 * time.Second
)

// Members is this agent's view of the live agents.
type Members struct {
	cfg  Config
	ml   *memberlist.Memberlist
	log  *slog.Logger
	done chan struct{}
	wg   sync.WaitGroup

	mu        sync.Mutex
	peers     []string
	settledAt time.Time         // zero: not settled, and no exchange with a peer yet
	waiting   time.Time         // the start or last Reset: when settling alone is measured from
	alive     map[string]member // live agents, Nodes only once nodes is known
	nodes     map[string]string // the Kubernetes Nodes: name -> published gossip address; nil: not known yet
	joinAll   bool              // the next rejoin joins every peer, alive or not
	kick      chan struct{}

	refused atomic.Uint64 // alive messages refused: no Node, not its address, or beyond MaxMembers

	// now is the clock of the settle and alone waits (time.Now; tests
	// of those waits set their own); read with m.mu held.
	now func() time.Time
}

// member is a live agent in this agent's view.
type member struct {
	addr  string // its gossip address
	since time.Time
}

// Start joins the gossip on cfg.Addr. It returns at once: peers that do
// not answer yet are joined by the rejoin loop.
func Start(cfg Config) (*Members, error) {
	if cfg.Name == "" || !cfg.Addr.IsValid() {
		return nil, errors.New("members: a node name and a LAN address are needed")
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Rejoin == 0 {
		cfg.Rejoin = DefaultRejoin
	}
	if cfg.Alone == 0 {
		cfg.Alone = DefaultAlone
	}
	if cfg.MaxMembers == 0 {
		cfg.MaxMembers = DefaultMaxMembers
	}
	lg := cfg.Log
	if lg == nil {
		lg = slog.Default()
	}
	m := &Members{cfg: cfg, log: lg.With("component", "members"), done: make(chan struct{}), alive: map[string]member{}, kick: make(chan struct{}, 1), now: time.Now}
	m.peers = m.normalise(cfg.Peers)
	m.waiting = m.now()

	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.BindAddr = cfg.Addr.String()
	mc.BindPort = cfg.Port
	mc.AdvertiseAddr = cfg.Addr.String()
	mc.AdvertisePort = cfg.Port
	mc.ProbeInterval = 100 * time.Millisecond
	mc.ProbeTimeout = 50 * time.Millisecond
	mc.SuspicionMult = 2
	mc.SuspicionMaxTimeoutMult = 3
	mc.GossipInterval = 50 * time.Millisecond
	mc.GossipNodes = 3
	mc.RetransmitMult = 3
	mc.TCPTimeout = time.Second
	mc.PushPullInterval = 10 * time.Second
	mc.GossipToTheDeadTime = 5 * time.Second
	// A node that comes back under the same name with another address
	// (DHCP on the LAN) is the same node.
	mc.DeadNodeReclaimTime = time.Second
	mc.Events = &events{m: m}
	mc.Alive = &events{m: m}
	mc.Logger = log.New(slogWriter{m.log}, "", 0)
	if len(cfg.Key) > 0 {
		mc.SecretKey = cfg.Key
	}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{cfg.Addr.String()},
		BindPort:  cfg.Port,
		Logger:    mc.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("members: listen on %s: %w", net.JoinHostPort(cfg.Addr.String(), strconv.Itoa(cfg.Port)), err)
	}
	if cfg.Dial != nil {
		mc.Transport = &dialTransport{NetTransport: nt, dial: cfg.Dial}
	} else {
		mc.Transport = nt
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = nt.Shutdown()
		return nil, fmt.Errorf("members: start gossip as %s on %s: %w", cfg.Name, cfg.Addr, err)
	}
	m.ml = ml
	m.wg.Add(1)
	go func() { defer m.wg.Done(); m.rejoinLoop() }()
	return m, nil
}

// normalise gives every peer address the gossip port and drops this
// node's own.
func (m *Members) normalise(peers []string) []string {
	self := net.JoinHostPort(m.cfg.Addr.String(), strconv.Itoa(m.cfg.Port))
	var out []string
	for _, p := range peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			p = net.JoinHostPort(p, strconv.Itoa(m.cfg.Port))
		}
		if p != self {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SetPeers replaces the known peer addresses (from the node registry).
// While this node has not settled, a peer address it did not know gives
// that peer Alone to answer, from now: on a fresh cluster the agents
// publish their gossip addresses only once the API server lets them
// write, and an agent that counted Alone from its own start would settle
// by itself just as its peers became reachable, and claim beside them.
func (m *Members) SetPeers(peers []string) {
	n := m.normalise(peers)
	m.mu.Lock()
	if m.settledAt.IsZero() {
		for _, p := range n {
			if !slices.Contains(m.peers, p) {
				m.waiting = m.now()
				break
			}
		}
	}
	m.peers = n
	m.mu.Unlock()
}

// SetNodes tells which members may count: the Kubernetes Nodes, each
// with the gossip address it published (village.cni.io/lan-member; ""
// while it has published none). From then on only an agent whose name is
// a Node and whose address is the one that Node published counts as
// alive (and so as a writer or announcer): a LAN host without the gossip
// key joining under a new name, or under a Node's name from another
// address, is refused. nil means not known (the API server has not
// answered and nothing was kept): every member counts, up to MaxMembers.
func (m *Members) SetNodes(nodes map[string]string) {
	m.mu.Lock()
	if nodes != nil {
		nodes = maps.Clone(nodes)
	}
	m.nodes = nodes
	dropped := false
	for name, mb := range m.alive {
		if m.refuseLocked(name, mb.addr) != nil {
			delete(m.alive, name)
			dropped = true
		}
	}
	m.mu.Unlock()
	if dropped {
		m.changed()
	}
}

// refuseLocked says why the agent name at addr does not count, or nil
// when it does. m.mu is held.
func (m *Members) refuseLocked(name, addr string) error {
	if m.nodes == nil || name == m.cfg.Name {
		return nil
	}
	want, ok := m.nodes[name]
	switch {
	case !ok:
		return fmt.Errorf("%q is no Kubernetes Node", name)
	case want != addr:
		return fmt.Errorf("Node %s published gossip address %q, not %s", name, want, addr)
	}
	return nil
}

// admitLocked makes room for name among the alive, under MaxMembers: a
// member that is no Node goes first, else the oldest; a name that is no
// Node is refused instead when full. m.mu is held.
func (m *Members) admitLocked(name string) error {
	if _, ok := m.alive[name]; ok || len(m.alive) < m.cfg.MaxMembers {
		return nil
	}
	if _, isNode := m.nodes[name]; !isNode {
		return fmt.Errorf("%d members already (the most kept): %q refused", len(m.alive), name)
	}
	victim := ""
	for n, mb := range m.alive {
		_, isNode := m.nodes[n]
		if !isNode {
			victim = n
			break
		}
		if victim == "" || mb.since.Before(m.alive[victim].since) {
			victim = n
		}
	}
	delete(m.alive, victim)
	return nil
}

// Alive reports whether the agent of node is alive in this agent's view.
// This node is alive to itself.
func (m *Members) Alive(node string) bool {
	if node == m.cfg.Name {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.alive[node]
	return ok
}

// Live lists the names of the live agents, this one included, sorted.
func (m *Members) Live() []string {
	m.mu.Lock()
	out := []string{m.cfg.Name}
	for n := range m.alive {
		if n != m.cfg.Name {
			out = append(out, n)
		}
	}
	m.mu.Unlock()
	slices.Sort(out)
	return out
}

// Settled reports whether this agent has exchanged state with a peer and
// waited Settle since, or has no peers to wait for.
func (m *Members) Settled() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.othersLocked() {
		return true
	}
	return !m.settledAt.IsZero() && !m.now().Before(m.settledAt)
}

// othersLocked reports whether there are other agents to wait for: a
// peer address, or another Node that has published none yet. On a fresh
// cluster every agent starts at once, before any has published its
// gossip address; each alone would claim every Service address, and the
// claims would flap until the gossip formed. Such an agent waits for a
// peer's exchange or for Alone, as one with peers does. m.mu is held.
func (m *Members) othersLocked() bool {
	if len(m.peers) > 0 {
		return true
	}
	for name := range m.nodes {
		if name != m.cfg.Name {
			return true
		}
	}
	return false
}

// Close leaves the gossip (telling the others at once, so they need not
// detect the departure) and stops.
func (m *Members) Close() error {
	close(m.done)
	m.wg.Wait()
	err := m.ml.Leave(time.Second)
	return errors.Join(err, m.ml.Shutdown())
}

// rejoinLoop joins known peers that are not alive, and settles a node
// alone when none has answered for Alone.
func (m *Members) rejoinLoop() {
	t := time.NewTicker(m.cfg.Rejoin)
	defer t.Stop()
	for {
		m.rejoin()
		select {
		case <-t.C:
		case <-m.kick:
		case <-m.done:
			return
		}
	}
}

func (m *Members) rejoin() {
	m.mu.Lock()
	peers := slices.Clone(m.peers)
	all := m.joinAll
	waits := m.othersLocked()
	m.mu.Unlock()
	if !waits {
		return
	}
	alive := map[string]bool{}
	m.mu.Lock()
	others := 0
	for n, mb := range m.alive {
		alive[mb.addr] = true
		if n != m.cfg.Name {
			others++
		}
	}
	alone := others == 0 && m.settledAt.IsZero() && m.now().Sub(m.waiting) >= m.cfg.Alone
	if alone {
		m.settledAt = m.now()
	}
	m.mu.Unlock()
	if alone {
		m.log.Info("no peer has answered: settled alone", "after", m.cfg.Alone)
		m.changed()
	}
	var missing []string
	for _, p := range peers {
		if all || !alive[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return
	}
	// One join per peer, side by side: a peer that does not answer
	// (still off the LAN, or this node's own uplink down) holds up no
	// other for its TCP timeout.
	var wg sync.WaitGroup
	var joined atomic.Int32
	for _, p := range missing {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.ml.Join([]string{p}); err != nil {
				m.log.Debug("joining peer", "peer", p, "err", err)
				return
			}
			joined.Add(1)
		}()
	}
	wg.Wait()
	n := joined.Load()
	if n > 0 {
		m.mu.Lock()
		m.joinAll = false
		m.mu.Unlock()
		m.startSettle()
	}
}

// Reset withdraws trust in the current view and exchanges state with
// every peer again, at once and until one answers; Settled is false until
// Settle after that. The speaker calls it whenever the LAN interface goes
// down or up: a node that was off the LAN, however briefly, may have been
// declared dead and replaced, and must not answer until the others know
// it is back (its exchange makes them see it alive, or makes it refute
// their verdict, within the settle time).
func (m *Members) Reset() {
	m.mu.Lock()
	m.settledAt = time.Time{}
	m.waiting = m.now()
	m.joinAll = true
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// startSettle starts the wait before claims, unless one is running or
// done: called on every exchange of state with a peer, ours (a join) or
// theirs (a peer joining us).
func (m *Members) startSettle() {
	m.mu.Lock()
	start := m.settledAt.IsZero()
	if start {
		m.settledAt = m.now().Add(m.cfg.Settle)
	}
	m.mu.Unlock()
	if !start {
		return
	}
	m.log.Info("exchanged state with a peer; claiming after settle", "settle", m.cfg.Settle)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTimer(m.cfg.Settle)
		defer t.Stop()
		select {
		case <-t.C:
			m.changed()
		case <-m.done:
		}
	}()
}

func (m *Members) changed() {
	if m.cfg.OnChange != nil {
		m.cfg.OnChange()
	}
}

// events keeps the view of live agents from memberlist's notifications,
// and turns them into OnChange. memberlist calls them with its state lock
// held, which is the only time its Node values may be read: it changes
// them in place later, so the view is a copy.
type events struct{ m *Members }

// set records n alive or not, and says whether it counts.
func (e *events) set(n *memberlist.Node, alive bool) bool {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if !alive {
		delete(e.m.alive, n.Name)
		return false
	}
	if e.m.refuseLocked(n.Name, n.Address()) != nil || e.m.admitLocked(n.Name) != nil {
		delete(e.m.alive, n.Name)
		return false
	}
	since := time.Now()
	if old, ok := e.m.alive[n.Name]; ok {
		since = old.since
	}
	e.m.alive[n.Name] = member{addr: n.Address(), since: since}
	return true
}

// NotifyAlive (memberlist.AliveDelegate) keeps out of memberlist's own
// member map an agent that does not count, and any new name beyond
// MaxMembers: a LAN host cannot grow it without bound.
func (e *events) NotifyAlive(n *memberlist.Node) error {
	if n.Name == e.m.cfg.Name {
		return nil
	}
	e.m.mu.Lock()
	err := e.m.refuseLocked(n.Name, n.Address())
	if _, ok := e.m.alive[n.Name]; err == nil && !ok && len(e.m.alive) >= e.m.cfg.MaxMembers {
		if _, isNode := e.m.nodes[n.Name]; !isNode {
			err = fmt.Errorf("%d members already (the most kept): %q refused", len(e.m.alive), n.Name)
		}
	}
	e.m.mu.Unlock()
	if err != nil {
		e.m.refused.Add(1)
	}
	return err
}

// Refused counts the alive messages refused so far: agents that are no
// Node, or not at the address their Node published, or new names beyond
// MaxMembers.
func (m *Members) Refused() uint64 { return m.refused.Load() }

func (e *events) NotifyJoin(n *memberlist.Node) {
	if !e.set(n, true) {
		return
	}
	if n.Name != e.m.cfg.Name {
		e.m.startSettle()
	}
	e.m.log.Info("agent alive", "node", n.Name, "addr", n.Address())
	e.m.changed()
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	e.set(n, false)
	e.m.log.Info("agent gone", "node", n.Name, "addr", n.Address())
	e.m.changed()
}

func (e *events) NotifyUpdate(n *memberlist.Node) {
	e.set(n, true)
	e.m.changed()
}

var _ memberlist.AliveDelegate = (*events)(nil)

// dialTransport is the NetTransport with its dials replaced.
type dialTransport struct {
	*memberlist.NetTransport
	dial func(addr string, timeout time.Duration) (net.Conn, error)
}

func (t *dialTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.dial(addr, timeout)
}

func (t *dialTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.dial(a.Addr, timeout)
}

// slogWriter carries memberlist's log lines to slog at debug level.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Debug(string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
