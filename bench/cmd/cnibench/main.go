// Command cnibench measures Village (village + village-ipam) against the
// reference plugins (bridge + host-local) side by side, through cnitool, in
// namespaces it makes and removes. scripts/bench.sh builds everything and
// runs it; see docs/performance.md for what each figure means.
//
// Every comparison alternates the two suites (A B A B, the first of each
// pair swapping every round) within one run, so machine noise lands on both
// sides; the table reports medians and ratios of medians.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

type options struct {
	bin, ref, cnitool, overlayTest string
	tcprr                          string
	crictl, moduleRoot             string
	criPods                        int
	seq, burst, width, rounds      int
	masqOffRounds                  int
	churn                          time.Duration
	burstConf                      string
	scale                          int
	memRuns                        int
	overlayCount                   int
	iperfSecs, iperfRounds         int
	only                           string
	dataRoot                       string
	verbose                        bool
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory of Village's binaries")
	flag.StringVar(&o.ref, "ref", "bin/ref", "directory of the reference plugins")
	flag.StringVar(&o.cnitool, "cnitool", "bin/cnitool", "cnitool binary")
	flag.StringVar(&o.overlayTest, "overlay-test", "", "compiled pkg/overlay test binary (go test -c); empty: skip the 1000-peer figures")
	flag.StringVar(&o.tcprr, "tcprr", "", "tcprr binary (go build ./bench/cmd/tcprr); empty: skip the datapath section")
	flag.StringVar(&o.crictl, "crictl", "", "crictl binary (scripts/crictl.sh); empty: skip the containerd runtime figures")
	flag.StringVar(&o.moduleRoot, "module-root", ".", "the Village source tree (the pause image for the runtime figures is built from it)")
	flag.IntVar(&o.criPods, "cri-pods", 15, "pods per suite started and stopped through containerd")
	flag.IntVar(&o.seq, "seq", 30, "pods in the sequential ADD/DEL runs")
	flag.IntVar(&o.masqOffRounds, "masqoff-rounds", 5, "rounds of the masqoff section (each o.seq pods per suite, ADD then DEL, ipMasq off)")
	flag.IntVar(&o.burst, "burst", 30, "pods per burst")
	flag.IntVar(&o.width, "width", 10, "concurrent operations in a burst")
	flag.IntVar(&o.rounds, "rounds", 3, "bursts per suite")
	flag.StringVar(&o.burstConf, "burst-conf", "", `extra keys of the burst network's plugin config, both suites (e.g. '"macspoofchk":true')`)
	flag.DurationVar(&o.churn, "churn", 0, "during the burst ADDs, commit an nf_tables transaction in the node namespace this often (e.g. 100ms: a node whose ruleset others change); 0: none")
	flag.IntVar(&o.scale, "scale", 250, "pods on one node for the scaling figure")
	flag.IntVar(&o.memRuns, "mem-runs", 5, "ADDs per suite for peak memory")
	flag.IntVar(&o.overlayCount, "overlay-count", 5, "runs of pkg/overlay's TestMeasureScale")
	flag.IntVar(&o.iperfSecs, "iperf-seconds", 3, "length of one iperf3 run")
	flag.IntVar(&o.iperfRounds, "iperf-rounds", 3, "iperf3 runs per path and mode")
	flag.StringVar(&o.only, "only", "", "comma-separated sections to run (latency,masqoff,backends,burst,scale,memory,overlay,throughput,datapath,runtime); empty: all but masqoff")
	flag.BoolVar(&o.verbose, "v", false, "print every sample series")
	flag.StringVar(&o.dataRoot, "data-root", "", "directory for the IPAM data directories (default: the run's temp dir; e.g. /dev/shm to take fsync cost out, for diagnosis)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fatal(fmt.Errorf("cnibench needs root: it makes network namespaces"))
	}
	for _, p := range []*string{&o.bin, &o.ref, &o.cnitool, &o.overlayTest, &o.tcprr, &o.crictl, &o.moduleRoot} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				fatal(err)
			}
			*p = abs
		}
	}
	tmp, err := os.MkdirTemp("", "cnibench-")
	if err != nil {
		fatal(err)
	}
	l := newLab(tmp)
	var once sync.Once
	done := func() {
		once.Do(func() {
			l.cleanup()
			_ = os.RemoveAll(tmp)
		})
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "cnibench: interrupted, removing namespaces")
		done()
		os.Exit(130)
	}()
	err = benchmark(l, o)
	done()
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "cnibench: %v\n", err)
	os.Exit(1)
}

func (o options) want(section string) bool {
	if o.only == "" {
		return true
	}
	for _, s := range strings.Split(o.only, ",") {
		if strings.TrimSpace(s) == section {
			return true
		}
	}
	return false
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func benchmark(l *lab, o options) error {
	v := &suite{name: "village", short: "v", main: "village", ipam: "village-ipam", binDir: o.bin}
	r := &suite{name: "reference", short: "r", main: "bridge", ipam: "host-local", binDir: o.ref}
	suites := []*suite{v, r}
	for _, s := range suites {
		s.cnitool = o.cnitool
		s.netPrefix = l.prefix + s.short + "-"
		base := filepath.Join(l.tmp, s.name)
		s.confDir, s.cacheDir, s.dataDir = filepath.Join(base, "net.d"), filepath.Join(base, "cache"), filepath.Join(base, "ipam")
		if o.dataRoot != "" {
			d, err := os.MkdirTemp(o.dataRoot, "cnibench-ipam-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(d)
			s.dataDir = d
		}
		for _, d := range []string{s.confDir, s.cacheDir, s.dataDir} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return err
			}
		}
		node, err := l.newNS("node" + s.short)
		if err != nil {
			return err
		}
		s.node = node
		// The same networks in both nodes: with and without masquerade, the
		// burst, the scaling run on a bridge of its own, and loopback only.
		confs := map[string]string{
			"masq":   s.netConf("masq", "cbr0", "10.90.0.0/24", true, ""),
			"nomasq": s.netConf("nomasq", "cbr1", "10.91.0.0/24", false, ""),
			"burst":  s.netConf("burst", "cbr2", "10.92.0.0/24", true, extraKeys(o.burstConf)),
			"scale":  s.netConf("scale", "cbr3", "10.93.0.0/24", true, ""),
			"mipt":   s.netConf("mipt", "cbr4", "10.94.0.0/24", true, `,"ipMasqBackend":"iptables"`),
			"mnft":   s.netConf("mnft", "cbr5", "10.95.0.0/24", true, `,"ipMasqBackend":"nftables"`),
			"bipt":   s.netConf("bipt", "cbr6", "10.97.0.0/24", true, `,"ipMasqBackend":"iptables"`),
			"bnft":   s.netConf("bnft", "cbr7", "10.98.0.0/24", true, `,"ipMasqBackend":"nftables"`),
			"lo":     s.loConf(),
		}
		for name, body := range confs {
			if err := s.writeConf(name, body); err != nil {
				return err
			}
		}
	}
	t := &table{title: fmt.Sprintf("Village (village + village-ipam) vs reference (bridge + host-local %s), medians, one run, cnitool exec per operation",
		"v1.10.0")}
	s := samples{}
	start := time.Now()
	startLoad := loadavg()
	if o.want("latency") {
		t.section()
		if err := latency(l, o, v, r, s, t); err != nil {
			return err
		}
	}
	// masqoff takes a few minutes of its own: only when asked for by name.
	if o.only != "" && o.want("masqoff") {
		t.section()
		if err := masqOff(l, o, v, r, t); err != nil {
			return err
		}
	}
	if o.want("backends") {
		t.section()
		if err := backends(l, o, v, r, s, t); err != nil {
			return err
		}
		if err := verification(v, s, t); err != nil {
			return err
		}
	}
	if o.want("burst") {
		t.section()
		if err := burst(l, o, v, r, s, t); err != nil {
			return err
		}
	}
	if o.want("scale") {
		t.section()
		if err := scaling(l, o, v, r, s, t); err != nil {
			return err
		}
	}
	if o.want("memory") {
		t.section()
		if err := memory(l, o, v, r, s, t); err != nil {
			return err
		}
	}
	if o.want("overlay") && o.overlayTest != "" {
		t.section()
		if err := overlayScale(o, s, t); err != nil {
			return err
		}
	}
	if o.want("runtime") && o.crictl != "" {
		t.section()
		if err := runtimeRow(l, o, v, r, s, t); err != nil {
			return err
		}
	}
	if o.want("throughput") {
		t.section()
		if err := throughput(l, o, v, s, t); err != nil {
			return err
		}
	}
	if o.want("datapath") && o.tcprr != "" {
		t.section()
		if err := datapath(l, o, v, s, t); err != nil {
			return err
		}
	}
	if o.verbose {
		fmt.Println()
		for k := range s {
			fmt.Println(s.summary(k))
		}
	}
	t.print(os.Stdout)
	fmt.Printf("\n%d cores, kernel %s, %s, run took %s\n", numCPU(), kernel(), time.Now().UTC().Format("2006-01-02 15:04 UTC"), time.Since(start).Round(time.Second))
	end := loadavg()
	fmt.Printf("load average (uptime: 1, 5, 15 min): at start %s, at end %s\n", strings.Join(startLoad[:], " "), strings.Join(end[:], " "))
	return nil
}

// order alternates which suite goes first: A B, then B A, ...
func order(i int, a, b *suite) []*suite {
	if i%2 == 0 {
		return []*suite{a, b}
	}
	return []*suite{b, a}
}

// latency: sequential ADD then DEL of o.seq pods, with and without
// masquerade, with the loopback floor interleaved.
func latency(l *lab, o options, v, r *suite, s samples, t *table) error {
	networks := []string{"masq", "nomasq"}
	if err := sequential(l, o, v, r, s, networks, ""); err != nil {
		return err
	}
	floor := s.med("v.lo.add")
	for _, network := range []string{"masq", "nomasq"} {
		what := "ipMasq on"
		if network == "nomasq" {
			what = "ipMasq off"
		}
		add := s.med("v." + network + ".add")
		radd := s.med("r." + network + ".add")
		row := row{metric: fmt.Sprintf("ADD, sequential, %s (%d pods)", what, o.seq), village: add, reference: radd, unit: "ms", ratio: math.NaN()}
		if network == "masq" {
			row.target = "≤ 0.50×"
			row.met = yes(add/radd <= 0.5)
		}
		t.add(row)
		del := s.med("v." + network + ".del")
		rdel := s.med("r." + network + ".del")
		row = row2(fmt.Sprintf("DEL, sequential, %s (%d pods)", what, o.seq), del, rdel, "ms")
		if network == "masq" {
			row.target = "≤ 0.35×"
			row.met = yes(del/rdel <= 0.35)
		}
		t.add(row)
	}
	t.add(row{metric: "exec floor: loopback-only ADD via cnitool", village: floor, reference: s.med("r.lo.add"), unit: "ms", ratio: math.NaN()})
	t.add(row{metric: "exec floor: loopback-only DEL via cnitool", village: s.med("v.lo.del"), reference: s.med("r.lo.del"), unit: "ms", ratio: math.NaN()})
	t.add(row{metric: "CPU time of one ADD, ipMasq on (cnitool and every process it waits for)", village: s.med("v.cpu.masq.add"),
		reference: s.med("r.cpu.masq.add"), unit: "ms", ratio: math.NaN()})
	t.add(row{metric: "CPU time of one DEL, ipMasq on", village: s.med("v.cpu.masq.del"), reference: s.med("r.cpu.masq.del"), unit: "ms", ratio: math.NaN()})
	t.add(row{metric: "CPU time of the exec floor (loopback ADD)", village: s.med("v.cpu.lo.add"), reference: s.med("r.cpu.lo.add"), unit: "ms", ratio: math.NaN()})
	gap := s.med("v.gap.masq.add")
	t.add(row{metric: "ADD (ipMasq on) above the exec floor", village: gap, reference: s.med("r.gap.masq.add"), unit: "ms",
		ratio: math.NaN(), target: "village ≤ 8 ms", met: yes(gap <= 8)})
	// The plugins' own cost: the median of each suite's operations minus
	// the exec floor (cnitool and a loopback-only network) measured right
	// after each on the same pod.
	for _, c := range []struct {
		network, verb, what string
		target              float64 // 0: informational
	}{
		{"masq", "add", "ADD, ipMasq on", 0.25},
		{"nomasq", "add", "ADD, ipMasq off", 0.60},
		{"masq", "del", "DEL, ipMasq on", 0.30},
		{"nomasq", "del", "DEL, ipMasq off", 0},
	} {
		v := s.med("v.gap." + c.network + "." + c.verb)
		r := s.med("r.gap." + c.network + "." + c.verb)
		rw := row2(c.what+", above the exec floor", v, r, "ms")
		if c.target > 0 {
			rw.target, rw.met = fmt.Sprintf("≤ %.2f×", c.target), yes(v/r <= c.target)
		}
		t.add(rw)
	}
	return nil
}

// sequential: ADD then DEL of o.seq pods per suite and network, the
// networks interleaved per pod and the suites alternating, each operation
// followed by the exec floor (a loopback-only network through cnitool on
// the same pod). Samples: <suite>.<network>.<verb> (wall), .cpu.<network>.<verb>,
// .gap.<network>.<verb> (wall minus the floor right after it) and
// .lo<floorTag>.<verb>.
func sequential(l *lab, o options, v, r *suite, s samples, networks []string, floorTag string) error {
	return sequentialFrom(l, o, v, r, s, networks, floorTag, 0)
}

// sequentialFrom is sequential with pod i's pair in order(first+i), so
// repeated runs can start with either suite.
func sequentialFrom(l *lab, o options, v, r *suite, s samples, networks []string, floorTag string, first int) error {
	// Both networks in one loop, alternating per pod: a phase run after the
	// other would overlap the kernel's asynchronous teardown of the first
	// phase's namespaces (RTNL and RCU waits), which made whichever network
	// came second look 15-25% slower in both suites.
	logf("sequential %s: %d pods per suite and network, interleaved", strings.Join(networks, ", "), o.seq)
	pods := map[string]map[*suite][]string{}
	for _, network := range networks {
		pods[network] = map[*suite][]string{}
		for _, su := range []*suite{v, r} {
			p, err := l.newPods("p"+su.short+network[:1], o.seq)
			if err != nil {
				return err
			}
			pods[network][su] = p
		}
	}
	for _, verb := range []string{"add", "del"} {
		for i := 0; i < o.seq; i++ {
			for k := range networks {
				network := networks[(i+k)%len(networks)]
				took := map[*suite]time.Duration{}
				for _, su := range order(first+i, v, r) {
					d, cpu, err := su.cnitoolCPU(verb, network, pods[network][su][i])
					if err != nil {
						return err
					}
					took[su] = d
					s.add(su.short+"."+network+"."+verb, ms(d))
					s.add(su.short+".cpu."+network+"."+verb, ms(cpu))
				}
				// The exec floor: loopback only, on the same pod right
				// after each operation. The plugins' own cost is the
				// median of the paired differences, so a change of load
				// moves both sides of a pair.
				for _, su := range order(first+i+1, v, r) {
					d, cpu, err := su.cnitoolCPU(verb, "lo", pods[network][su][i])
					if err != nil {
						return err
					}
					s.add(su.short+".lo"+floorTag+"."+verb, ms(d))
					s.add(su.short+".cpu.lo"+floorTag+"."+verb, ms(cpu))
					s.add(su.short+".gap."+network+"."+verb, ms(took[su]-d))
				}
			}
		}
	}
	for _, network := range networks {
		for _, su := range []*suite{v, r} {
			l.delAll(pods[network][su])
		}
	}
	// Let the kernel finish tearing those namespaces down before the next
	// section measures anything.
	time.Sleep(3 * time.Second)
	return nil
}

func row2(metric string, v, r float64, unit string) row {
	return row{metric: metric, village: v, reference: r, unit: unit, ratio: math.NaN()}
}

// burstRounds: o.rounds times per suite, alternating, o.burst pods ADDed
// o.width at a time on network, then DELed the same way. Samples:
// <suite>.<key>.<verb> (wall of all) and <suite>.<key>cpu.<verb> (CPU of all).
func burstRounds(l *lab, o options, v, r *suite, s samples, network, key string) error {
	logf("burst %s: %d pods, %d at a time, %d rounds per suite", network, o.burst, o.width, o.rounds)
	for round := 0; round < o.rounds; round++ {
		pods := map[*suite][]string{}
		for _, su := range []*suite{v, r} {
			p, err := l.newPods("b"+su.short, o.burst)
			if err != nil {
				return err
			}
			pods[su] = p
		}
		for _, verb := range []string{"add", "del"} {
			for _, su := range order(round, v, r) {
				errs := make([]error, o.burst)
				cpus := make([]time.Duration, o.burst)
				var churned <-chan int
				stop := make(chan struct{})
				if o.churn > 0 && verb == "add" {
					var err error
					if churned, err = churn(su.node, o.churn, stop); err != nil {
						return err
					}
				}
				start := time.Now()
				parallel(o.burst, o.width, func(i int) {
					_, cpus[i], errs[i] = su.cnitoolCPU(verb, network, pods[su][i])
				})
				wall := time.Since(start)
				close(stop)
				if churned != nil {
					logf("burst %s %s: %d nf_tables transactions of others during the ADDs", network, su.name, <-churned)
				}
				var cpu time.Duration
				for _, c := range cpus {
					cpu += c
				}
				s.add(su.short+"."+key+"cpu."+verb, ms(cpu))
				for _, err := range errs {
					if err != nil {
						return err
					}
				}
				s.add(su.short+"."+key+"."+verb, ms(wall))
			}
		}
		for _, su := range []*suite{v, r} {
			l.delAll(pods[su])
		}
	}
	return nil
}

// burst: o.burst pods, o.width at a time; wall time of all ADDs, then of
// all DELs, o.rounds times per suite, alternating.
func burst(l *lab, o options, v, r *suite, s samples, t *table) error {
	if err := burstRounds(l, o, v, r, s, "burst", "burst"); err != nil {
		return err
	}
	add, radd := s.med("v.burst.add"), s.med("r.burst.add")
	rw := row2(fmt.Sprintf("burst ADD wall, %d pods %d at a time", o.burst, o.width), add, radd, "ms")
	rw.target, rw.met = "≤ 0.40×", yes(add/radd <= 0.4)
	t.add(rw)
	t.add(row2(fmt.Sprintf("burst ADD, CPU time of all %d ADDs (all processes)", o.burst), s.med("v.burstcpu.add"), s.med("r.burstcpu.add"), "ms"))
	del, rdel := s.med("v.burst.del"), s.med("r.burst.del")
	rw = row2(fmt.Sprintf("burst DEL wall, %d pods %d at a time", o.burst, o.width), del, rdel, "ms")
	rw.target, rw.met = "≤ 0.30×", yes(del/rdel <= 0.3)
	t.add(rw)
	return nil
}

// scaling: o.scale pods on one node per suite (alternating), ADD latency
// of the last 10 against the first 10.
func scaling(l *lab, o options, v, r *suite, s samples, t *table) error {
	logf("scaling: %d pods per suite on one node", o.scale)
	pods := map[*suite][]string{}
	for _, su := range []*suite{v, r} {
		p, err := l.newPods("s"+su.short, o.scale)
		if err != nil {
			return err
		}
		pods[su] = p
	}
	for i := 0; i < o.scale; i++ {
		for _, su := range order(i, v, r) {
			d, err := su.cnitoolRun("add", "scale", pods[su][i])
			if err != nil {
				return err
			}
			switch {
			case i < 10:
				s.add(su.short+".scale.first", ms(d))
			case i >= o.scale-10:
				s.add(su.short+".scale.last", ms(d))
			}
		}
	}
	// DEL of the last 10 on the full node (the reference scans its data
	// directory on every DEL), alternating.
	for i := o.scale - 1; i >= o.scale-10; i-- {
		for _, su := range order(i, v, r) {
			d, err := su.cnitoolRun("del", "scale", pods[su][i])
			if err != nil {
				return err
			}
			s.add(su.short+".scale.lastdel", ms(d))
		}
	}
	for _, su := range []*suite{v, r} {
		l.delAll(pods[su])
	}
	first, last := s.med("v.scale.first"), s.med("v.scale.last")
	rfirst, rlast := s.med("r.scale.first"), s.med("r.scale.last")
	t.add(row2("ADD, pods 1–10 on a node", first, rfirst, "ms"))
	t.add(row2(fmt.Sprintf("ADD, pods %d–%d on the same node", o.scale-9, o.scale), last, rlast, "ms"))
	t.add(row{metric: fmt.Sprintf("scaling: ADD pods %d–%d ÷ pods 1–10 (each suite)", o.scale-9, o.scale), village: last / first, reference: rlast / rfirst,
		unit: "×", ratio: math.NaN(), target: "village ≤ 1.20×", met: yes(last/first <= 1.2)})
	t.add(row2(fmt.Sprintf("DEL, pods %d–%d with %d on the node", o.scale-9, o.scale, o.scale), s.med("v.scale.lastdel"), s.med("r.scale.lastdel"), "ms"))
	return nil
}

// memory: peak RSS of one ADD. The main plugin is exec'd directly with the
// runtime's environment so wait4 reports on it; its ru_maxrss is the larger
// of the plugin and the children it waited for (IPAM, and iptables for the
// reference), so the IPAM plugin is also run alone and the sum is reported
// as the peak of the two processes together (an upper bound: the two are
// alive at the same time while the main plugin waits for IPAM).
func memory(l *lab, o options, v, r *suite, s samples, t *table) error {
	logf("memory: %d ADDs per suite", o.memRuns)
	type conf struct{ stdin []byte }
	stdin := map[*suite][]byte{}
	for _, su := range []*suite{v, r} {
		b, err := pluginConf(su.netConf("masq", "cbr0", "10.90.0.0/24", true, ""))
		if err != nil {
			return err
		}
		stdin[su] = b
	}
	pods := map[*suite][]string{}
	for _, su := range []*suite{v, r} {
		p, err := l.newPods("m"+su.short, o.memRuns+1)
		if err != nil {
			return err
		}
		pods[su] = p
		// A first pod puts the bridge and masquerade in place, as on any
		// node that already runs pods; it is not measured.
		if _, err := su.execPlugin(su.main, "ADD", "mem-warm", p[o.memRuns], stdin[su]); err != nil {
			return err
		}
	}
	for i := 0; i < o.memRuns; i++ {
		for _, su := range order(i, v, r) {
			id := fmt.Sprintf("mem-%d", i)
			rss, err := su.execPlugin(su.main, "ADD", id, pods[su][i], stdin[su])
			if err != nil {
				return err
			}
			s.add(su.short+".mem.main", float64(rss)/(1<<20))
			rss, err = su.execPlugin(su.ipam, "ADD", id+"-ipam", pods[su][i], stdin[su])
			if err != nil {
				return err
			}
			s.add(su.short+".mem.ipam", float64(rss)/(1<<20))
			for _, c := range []struct{ bin, id string }{{su.main, id}, {su.ipam, id + "-ipam"}} {
				if _, err := su.execPlugin(c.bin, "DEL", c.id, pods[su][i], stdin[su]); err != nil {
					return err
				}
			}
		}
	}
	for _, su := range []*suite{v, r} {
		l.delAll(pods[su])
	}
	main, ipam := s.med("v.mem.main"), s.med("v.mem.ipam")
	rmain, ripam := s.med("r.mem.main"), s.med("r.mem.ipam")
	t.add(row2("peak RSS, main plugin ADD (max of it and its children, wait4)", main, rmain, "MB"))
	t.add(row2("peak RSS, IPAM plugin ADD alone", ipam, ripam, "MB"))
	t.add(row{metric: "peak memory of one ADD (main + IPAM, sum)", village: main + ipam, reference: rmain + ripam, unit: "MB", ratio: math.NaN(),
		target: "village ≤ 16 MB", met: yes(main+ipam <= 16)})
	return nil
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

func kernel() string {
	out, err := run(context.Background(), 5*time.Second, "uname", "-r")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(out)
}
