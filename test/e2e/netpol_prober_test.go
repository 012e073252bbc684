package e2e

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/testenv"
)

// A prober connects from one namespace to a victim address in a loop
// until stopped, and to a control address between its tries: what policy
// must stop is reachability at the network level, so a probe is judged
// by what came back, not by whether a whole answer arrived in time.
//
//   - An answer or a refusal (a RST: the SYN reached the victim's stack)
//     is "through": the probe passed policy.
//   - A timeout is "dropped": nothing came back within probeBound.
//   - Anything else (an ICMP unreachable, or no neighbour: the node's
//     router has nobody at that address yet, as before a pod's ADD) is
//     "unreachable": the probe never got to the victim.
//
// Each try is given seconds (probeBound), so a loaded machine that is
// slow to answer counts as an answer, not as a drop. The control must
// answer in every window a test waits for (waitTries), so a prober whose
// own path is dead (its namespace, its route, its servers) cannot pass by
// never reaching anything.
type prober struct {
	tries, through, dropped, unreachable atomic.Int64
	ctlTries, ctlGot                     atomic.Int64
	lastErr                              atomic.Value // string
	done                                 chan struct{}
	wg                                   sync.WaitGroup
}

// probeBound is how long one probe waits for anything to come back.
const probeBound = testenv.DialBound

// probeWorkers run at once, so seconds-long tries still probe the window
// often.
const probeWorkers = 4

// target is an address and port.
type target struct {
	ip   string
	port int
}

// probeThrough says whether a probe's result shows that its SYN reached
// the victim: an answer, or a refusal from the victim's own stack.
func probeThrough(err error) bool {
	return err == nil || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// probeConnect opens a TCP connection from from to ip:port: connected is
// through, whatever the server then says.
func probeConnect(from ns.NetNS, ip string, port int) error {
	return testenv.InNS(from, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), probeBound)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// startProber probes victim ip:80 from from, and ctl between tries.
func startProber(from ns.NetNS, ip string, ctl target) *prober {
	p := &prober{done: make(chan struct{})}
	for range probeWorkers {
		p.wg.Go(func() {
			for {
				select {
				case <-p.done:
					return
				default:
				}
				err := probeConnect(from, ip, 80)
				switch {
				case probeThrough(err):
					p.through.Add(1)
				case isTimeout(err):
					p.dropped.Add(1)
				default:
					p.unreachable.Add(1)
					p.lastErr.Store(err.Error())
				}
				p.tries.Add(1)
				cerr := testenv.Dial(from, ctl.ip, ctl.port, probeBound)
				p.ctlTries.Add(1)
				if cerr == nil {
					p.ctlGot.Add(1)
				} else {
					p.lastErr.Store("control: " + cerr.Error())
				}
			}
		})
	}
	return p
}

// waitTries waits for n more tries from now, with the control answering
// at least once in that window.
func (p *prober) waitTries(t *testing.T, n int64) {
	t.Helper()
	from, ctl := p.tries.Load(), p.ctlGot.Load()
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d more probes and a control answer", n), func() (bool, string) {
		return p.tries.Load() >= from+n && p.ctlGot.Load() > ctl, p.String()
	})
}

func (p *prober) String() string {
	last, _ := p.lastErr.Load().(string)
	return fmt.Sprintf("%d tries: %d through, %d dropped, %d unreachable; control %d of %d answered; last error %q",
		p.tries.Load(), p.through.Load(), p.dropped.Load(), p.unreachable.Load(), p.ctlGot.Load(), p.ctlTries.Load(), last)
}

// stop ends the probes and returns the victim's tries and how many got
// through.
func (p *prober) stop() (tries, through int64) {
	close(p.done)
	p.wg.Wait()
	return p.tries.Load(), p.through.Load()
}
