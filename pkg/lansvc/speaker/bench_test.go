package speaker_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/mdlayher/arp"

	"github.com/village-cni/village/internal/testenv"
)

// firstAnswer asks the LAN for a every 10 ms from the client and returns
// how long after start the first answer from mac came (the clock starts
// with start, before the fault is made).
func (c *cluster) firstAnswer(a netip.Addr, mac net.HardwareAddr, start time.Time) (time.Duration, error) {
	var d time.Duration
	err := testenv.InNS(c.client.NS, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		cl, err := arp.Dial(ifi)
		if err != nil {
			return err
		}
		defer cl.Close()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			for {
				_ = cl.Request(a)
				select {
				case <-t.C:
				case <-stop:
					return
				}
			}
		}()
		deadline := time.Now().Add(time.Minute)
		_ = cl.SetReadDeadline(deadline)
		for {
			p, _, err := cl.Read()
			if err != nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("no answer for %s from %s within a minute", a, mac)
				}
				continue
			}
			if p.Operation == arp.OperationReply && p.SenderIP == a && p.SenderHardwareAddr.String() == mac.String() {
				d = time.Since(start)
				return nil
			}
		}
	})
	return d, err
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func load() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := string(b)
	for i, r := range f {
		if r == ' ' {
			return f[:i]
		}
	}
	return f
}

// BenchmarkFailover: three nodes on a LAN, one address; the owner's
// uplink is pulled ($VILLAGE_LANSVC_KILLS times, default 20), and the
// time from the pull to the first ARP answer from the next owner is
// measured by a client asking every 10 ms; then the uplink is put back
// and the time to the returning owner's first answer is measured too.
// Reports p50 and p99 of both, with the load average; any moment of two
// holders fails it.
func BenchmarkFailover(b *testing.B) {
	kills := testenv.EnvCount("VILLAGE_LANSVC_KILLS", 20, 1)
	c := newCluster(b, 3)
	c.want(vip4)
	all := c.names()
	c.answeredBy(vip4, c.owner(vip4, all...))
	var fail, back []time.Duration
	stop := c.watchSplitBrain()
	b.ResetTimer()
	for range b.N {
		for range kills {
			gone := c.owner(vip4, all...)
			var rest []string
			for _, n := range all {
				if n != gone.name {
					rest = append(rest, n)
				}
			}
			next := c.owner(vip4, rest...)
			start := time.Now()
			c.lan.Unplug(gone.LANHost)
			d, err := c.firstAnswer(vip4, next.MAC, start)
			if err != nil {
				b.Fatal(err)
			}
			fail = append(fail, d)
			c.answeredBy(vip4, next)
			start = time.Now()
			c.lan.Plug(gone.LANHost)
			d, err = c.firstAnswer(vip4, gone.MAC, start)
			if err != nil {
				b.Fatal(err)
			}
			back = append(back, d)
			c.answeredBy(vip4, gone)
		}
	}
	b.StopTimer()
	if split := stop(); len(split) > 0 {
		b.Fatalf("split brain: %v", split)
	}
	b.ReportMetric(float64(pct(fail, 0.5).Milliseconds()), "failover-p50-ms")
	b.ReportMetric(float64(pct(fail, 0.99).Milliseconds()), "failover-p99-ms")
	b.ReportMetric(float64(pct(back, 0.5).Milliseconds()), "return-p50-ms")
	b.ReportMetric(float64(pct(back, 0.99).Milliseconds()), "return-p99-ms")
	b.Logf("FIGURE lan-failover kills=%d failover p50 %v p99 %v max %v; return p50 %v p99 %v (load %s)",
		len(fail), pct(fail, 0.5), pct(fail, 0.99), pct(fail, 1), pct(back, 0.5), pct(back, 0.99), load())
}
