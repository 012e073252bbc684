package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/village-cni/village/pkg/agent"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/drops"
	"github.com/village-cni/village/pkg/netpol/table"
)

// `villaged drops` prints what NetworkPolicy dropped on this node: the
// exact count of each pod's chains (read from nftables, as root on the
// node) and the latest dropped packets the agent named from its samples
// (<run dir>/<network>/policy-drops.json, pkg/netpol/drops), one line per
// source, destination, protocol, port and direction.
func init() {
	register(command{name: "drops", summary: "what NetworkPolicy dropped on this node: exact counts per pod and the latest packets, named", run: cmdDrops})
}

// dropsFilter is what --since, --namespace and --pod keep.
type dropsFilter struct {
	since     time.Duration
	namespace string
	pod       string
}

// keepPod says whether pod (namespace/name, "" for an address) passes the
// namespace and pod filters.
func (f dropsFilter) keepPod(pod string) bool {
	ns, name, _ := strings.Cut(pod, "/")
	return (f.namespace == "" || ns == f.namespace) && (f.pod == "" || name == f.pod)
}

func (f dropsFilter) keep(d drops.Drop, now time.Time) bool {
	if f.since > 0 && d.Last.Before(now.Add(-f.since)) {
		return false
	}
	return f.keepPod(d.Source.Pod) || f.keepPod(d.Destination.Pod)
}

// ChainCount is the exact count of one pod's chain.
type ChainCount struct {
	Pod       string   `json:"pod"`
	Direction string   `json:"direction"`
	Policies  []string `json:"policies,omitempty"`
	Packets   uint64   `json:"packets"`
	Bytes     uint64   `json:"bytes"`
}

// DropsReport is what `villaged drops --json` prints.
type DropsReport struct {
	Network string `json:"network"`
	// Counts are the exact counts (absent when nftables could not be
	// read: CountsError says why).
	Counts      []ChainCount `json:"counts,omitempty"`
	CountsError string       `json:"countsError,omitempty"`
	// Samples is how many samples the agent received since it started;
	// Drops are the latest aggregated ones, filtered, the latest first.
	Samples uint64       `json:"samples"`
	Drops   []drops.Drop `json:"drops"`
	// File is when the agent wrote the drops file (zero: no file yet).
	File time.Time `json:"file,omitzero"`
}

// report makes the report from what was read, filtered.
func report(network string, cds []table.ChainDrops, cerr error, names *drops.Names, file *drops.File, f dropsFilter, now time.Time) DropsReport {
	r := DropsReport{Network: network, Drops: []drops.Drop{}}
	if cerr != nil {
		r.CountsError = cerr.Error()
	}
	for _, cd := range cds {
		pod := cd.Key
		if pod == "" {
			pod = names.PodOfChain(cd.Chain)
		}
		if pod == "" {
			pod = cd.Chain
		}
		if !f.keepPod(pod) {
			continue
		}
		r.Counts = append(r.Counts, ChainCount{Pod: pod, Direction: cd.Direction, Policies: names.Isolating(pod, cd.Direction), Packets: cd.Packets, Bytes: cd.Bytes})
	}
	sortCounts(r.Counts)
	if file != nil {
		r.Samples, r.File = file.Samples, file.Time
		for _, d := range file.Drops {
			if f.keep(d, now) {
				r.Drops = append(r.Drops, d)
			}
		}
	}
	return r
}

// print writes r for people: the counts, then one line per drop.
func (r DropsReport) print(w io.Writer) {
	switch {
	case r.CountsError != "":
		fmt.Fprintf(w, "exact counts: not read (%s)\n", r.CountsError)
	case len(r.Counts) == 0:
		fmt.Fprintln(w, "exact counts: no isolated pod on this node")
	default:
		fmt.Fprintln(w, "exact counts (nftables):")
		for _, c := range r.Counts {
			fmt.Fprintf(w, "  %-7s %s  %d packets, %d bytes  %s\n", c.Direction, c.Pod, c.Packets, c.Bytes, policies(c.Policies))
		}
	}
	if r.File.IsZero() {
		fmt.Fprintln(w, "latest drops: none sampled yet (no drops file: is `villaged run` running on this node?)")
		return
	}
	fmt.Fprintf(w, "latest drops (%d samples since the agent started, at most 20 a second per pod and direction):\n", r.Samples)
	for _, d := range r.Drops {
		fmt.Fprintln(w, "  "+dropLine(d))
	}
}

// dropLine is one aggregated drop: time last, count, direction, source →
// destination proto/port, policies.
func dropLine(d drops.Drop) string {
	what := d.Proto
	if d.Port != 0 {
		what = fmt.Sprintf("%s/%d", d.Proto, d.Port)
	}
	return fmt.Sprintf("%s  %5d  %-7s  %s → %s %s  %s", d.Last.UTC().Format("15:04:05"), d.Count, d.Direction, d.Source, d.Destination, what, policies(d.Policies))
}

func policies(ps []string) string {
	if len(ps) == 0 {
		return "(no policy known)"
	}
	return "policies " + strings.Join(ps, ",")
}

func cmdDrops(args []string, stdout, stderr io.Writer) error {
	var opts agent.Options
	fs := agentFlags("drops", stderr, &opts)
	asJSON := fs.Bool("json", false, "print JSON (DropsReport)")
	since := fs.Duration("since", 0, "only drops seen within this long (e.g. 5m)")
	namespace := fs.String("namespace", "", "only drops from or to pods of this namespace")
	pod := fs.String("pod", "", "only drops from or to pods of this name")
	watch := fs.Bool("watch", false, "print again whenever the drops file changes, until interrupted")
	if err := parseAgentFlags(fs, args, &opts); err != nil {
		return err
	}
	c, err := agent.Load(opts)
	if err != nil {
		return err
	}
	if !c.Net.NetworkPolicy {
		return fmt.Errorf("NetworkPolicy is off on network %s (%s has no \"networkPolicy\": true): nothing is dropped", c.Net.Name, c.File)
	}
	network, f := c.Net.Name, dropsFilter{since: *since, namespace: *namespace, pod: *pod}
	show := func() error {
		m, err := controller.ReadModel(opts.RunDir, network)
		if err != nil {
			return err
		}
		names := drops.NamesOf(m)
		var cds []table.ChainDrops
		var cerr error
		if os.Geteuid() != 0 {
			cerr = fmt.Errorf("run as root on the node")
		} else {
			cds, cerr = table.Drops(network)
		}
		file, err := drops.Read(opts.RunDir, network)
		if err != nil {
			return err
		}
		r := report(network, cds, cerr, names, file, f, time.Now())
		if *asJSON {
			b, _ := json.MarshalIndent(r, "", "  ")
			fmt.Fprintln(stdout, string(b))
		} else {
			r.print(stdout)
		}
		return nil
	}
	if err := show(); err != nil || !*watch {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	path := drops.Path(opts.RunDir, network)
	last := mtime(path)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if t := mtime(path); !t.Equal(last) {
				last = t
				fmt.Fprintln(stdout)
				if err := show(); err != nil {
					return err
				}
			}
		}
	}
}

func mtime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// sortCounts orders counts by pod then direction (table.Drops gives them
// by chain name, where a hashed name sorts apart).
func sortCounts(cs []ChainCount) {
	slices.SortFunc(cs, func(a, b ChainCount) int {
		return strings.Compare(a.Pod+" "+a.Direction, b.Pod+" "+b.Direction)
	})
}
