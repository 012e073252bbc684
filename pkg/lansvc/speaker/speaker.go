// Package speaker runs one node's side of Services on the LAN: it puts
// together who is alive (pkg/lansvc/members), who should answer for each
// address (pkg/lansvc/elect) and the answering itself
// (pkg/lansvc/announce).
//
// Its input from the cluster is the last known set of wants (addresses
// and the nodes eligible for each), handed over by the Kubernetes side
// with SetWants. Nothing here talks to the API server: when it is
// unreachable, the last wants stay in force, and failover between live
// nodes goes on, driven by the gossip alone.
//
// The speaker recomputes its claim whenever the members change, the wants
// change, or the LAN interface goes down or up, and every Period as a
// backstop. It claims nothing while the LAN interface is down (its
// answers could not be heard, and on return it must not answer beside
// the node that took over), nor while members says its view is not
// settled.
package speaker

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/lansvc/announce"
	"github.com/village-cni/village/pkg/lansvc/elect"
)

// retryContested is how soon the speaker asks the Announcer again for an
// address left to another holder; the Announcer itself decides when it is
// probed again (its random delay, and its rate limit after repeated
// conflicts), so a contested address is not probed at this pace forever.
const retryContested = 200 * time.Millisecond

// Announcer is what the speaker needs of pkg/lansvc/announce.
type Announcer interface {
	Set(addrs []netip.Addr) error
}

// Members is what the speaker needs of pkg/lansvc/members.
type Members interface {
	Alive(node string) bool
	Settled() bool
	Reset()
}

// Config is what a Speaker is made with.
type Config struct {
	Node      string // this node's name
	Interface string // the LAN interface
	Announcer Announcer
	Members   Members
	// Period of the backstop recomputation; 0 means one second.
	Period time.Duration
	Log    *slog.Logger
}

// Speaker keeps the Announcer's set equal to this node's share.
type Speaker struct {
	cfg  Config
	log  *slog.Logger
	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	wants   []elect.Want
	up      bool
	lastErr string
}

// New starts the speaker. The link watch is opened in the calling
// thread's network namespace, like the Announcer's sockets.
func New(cfg Config) (*Speaker, error) {
	if cfg.Period == 0 {
		cfg.Period = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Speaker{cfg: cfg, log: cfg.Log.With("component", "speaker"), kick: make(chan struct{}, 1), done: make(chan struct{})}
	link, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("speaker: LAN interface %q: %w", cfg.Interface, err)
	}
	s.up = operUp(link)
	updates := make(chan netlink.LinkUpdate, 64)
	linkDone := make(chan struct{})
	if err := netlink.LinkSubscribeWithOptions(updates, linkDone, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case <-s.done: // the socket closing under the watch
			default:
				s.log.Warn("link watch", "err", err)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("speaker: watching LAN interface %s: %w", cfg.Interface, err)
	}
	index := link.Attrs().Index
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					return
				}
				if int(u.Index) != index {
					continue
				}
				s.setUp(operUp(u.Link))
			case <-s.done:
				close(linkDone)
				return
			}
		}
	}()
	go func() { defer s.wg.Done(); s.loop() }()
	return s, nil
}

func operUp(l netlink.Link) bool {
	a := l.Attrs()
	return a.Flags&(1<<0) != 0 && (a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown)
}

func (s *Speaker) setUp(up bool) {
	s.mu.Lock()
	was := s.up
	s.up = up
	s.mu.Unlock()
	if was != up {
		s.log.Info("LAN interface", "interface", s.cfg.Interface, "up", up)
		// Off the LAN even for a moment, this node may have been
		// replaced: it answers again only once the others know it is
		// back.
		s.cfg.Members.Reset()
		s.Kick()
	}
}

// SetWants replaces the wants: every address a Service on the LAN has,
// with its eligible nodes. Repeats are harmless.
func (s *Speaker) SetWants(w []elect.Want) {
	s.mu.Lock()
	s.wants = slices.Clone(w)
	s.mu.Unlock()
	s.Kick()
}

// Kick asks for a recomputation (members changed, say). It never blocks.
func (s *Speaker) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Close stops the speaker and answers for nothing any more.
func (s *Speaker) Close() error {
	close(s.done)
	s.wg.Wait()
	return s.cfg.Announcer.Set(nil)
}

func (s *Speaker) loop() {
	t := time.NewTicker(s.cfg.Period)
	defer t.Stop()
	for {
		s.sync()
		select {
		case <-s.kick:
		case <-t.C:
		case <-s.done:
			return
		}
	}
}

// sync hands the Announcer this node's share of the wants.
func (s *Speaker) sync() {
	s.mu.Lock()
	wants, up := s.wants, s.up
	s.mu.Unlock()
	var mine []netip.Addr
	if up && s.cfg.Members.Settled() {
		mine = elect.Mine(s.cfg.Node, wants, s.cfg.Members.Alive)
	}
	err := s.cfg.Announcer.Set(mine)
	if errors.Is(err, announce.ErrHandBack) || errors.Is(err, announce.ErrContested) {
		// Another node still answers for an address this one should
		// take (a hand-back: it lets go as soon as it sees the same
		// members), or another host does (the Announcer paces those
		// probes itself). Try again soon rather than at the next period.
		time.AfterFunc(retryContested, s.Kick)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.mu.Lock()
	repeat := msg == s.lastErr
	s.lastErr = msg
	s.mu.Unlock()
	if err != nil && !repeat {
		s.log.Info("answering for LAN Service addresses", "err", err)
	}
}
