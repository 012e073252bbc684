package attack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/drops"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// floodReport is the part of `villaged drops --json` (cmd/villaged
// DropsReport) the flood attack reads.
type floodReport struct {
	Counts []struct {
		Pod       string `json:"pod"`
		Direction string `json:"direction"`
		Packets   uint64 `json:"packets"`
	} `json:"counts"`
	CountsError string       `json:"countsError"`
	Samples     uint64       `json:"samples"`
	Drops       []drops.Drop `json:"drops"`
	File        time.Time    `json:"file"`
}

func (r floodReport) ingress(pod string) (uint64, bool) {
	for _, c := range r.Counts {
		if c.Pod == pod && c.Direction == "ingress" {
			return c.Packets, true
		}
	}
	return 0, false
}

// TestNetpolDropFlood: a pod floods a pod that a deny-all policy isolates
// with denied UDP, over IPv4 and IPv6, as fast as one sender goes (200000
// datagrams by default; VILLAGE_FLOOD_PACKETS changes it), to hide its
// traffic among the drops or to load the node's agent with them. The
// rules are Compile's, installed by table.Apply; the samples are received
// by the agent's own listener (drops.Run) in the node's namespace, and
// read back with the built `villaged drops --json`, as a user reads them.
//
//   - every packet is counted: the victim's ingress counter grows by
//     exactly the number of datagrams the attacker sent;
//   - the samples reaching the listener stay within the kernel's bound of
//     20 a second and a burst of 20 (table.SampleRate) over the flood's
//     duration, and at least the burst arrives, named with both pods;
//   - `villaged drops` answers during the flood, and a drops file written
//     during the flood shows the listener keeps up.
//
// A control pod the policy does not select answers the attacker in the
// same run, after the flood.
func TestNetpolDropFlood(t *testing.T) {
	testenv.RequireRoot(t)
	const network = "t" // labInput's
	run := t.TempDir()
	t.Setenv("VILLAGE_RUN_DIR", run)
	n := testenv.EnvCount("VILLAGE_FLOOD_PACKETS", 200000, 1000)
	l := testenv.NewPodLab(t)
	for i, name := range []string{"attacker", "victim", "control"} {
		l.AddPod(name, i+2, true)
	}
	// the attacker's neighbour entries of the victim are resolved before
	// the policy (ARP and NDP are not filtered): no datagram of the flood
	// waits in a neighbour queue, where the kernel may drop it before
	// it meets the policy
	l.Reach(t, "attacker", "victim", 80, true)

	in := labInput(l, []string{"attacker", "victim", "control"})
	in.Policies = []*networkingv1.NetworkPolicy{denyIngress("victim")}
	if err := testenv.InNS(l.Node, func() error { return table.Apply(netpol.Compile(in)) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.InNS(l.Node, func() error { return table.Remove(network) }) })
	// the names `villaged drops` reads, as the controller writes them
	model := netpol.BuildModel(in)
	b, err := json.Marshal(model)
	must(t, err, "the model")
	must(t, nodelocal.WriteFile(controller.ModelPath(run, network), b, 0o600), "writing the model")

	// the agent's listener, in the node's namespace
	nsFile, err := os.Open(l.Node.Path())
	must(t, err, "the node's namespace")
	defer nsFile.Close()
	rec := drops.NewRecorder(network, 0)
	rec.SetModel(model)
	ctx, cancel := context.WithCancel(context.Background())
	listened := make(chan error, 1)
	go func() {
		listened <- drops.Run(ctx, drops.Config{Network: network, RunDir: run, Recorder: rec, NetNS: int(nsFile.Fd()), Logf: t.Logf})
	}()
	defer func() {
		cancel()
		must(t, <-listened, "the NFLOG listener")
	}()

	conf := filepath.Join(t.TempDir(), "10-village.conflist")
	must(t, os.WriteFile(conf, fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":"br0","networkPolicy":true,
		"ipam":{"type":"village-ipam","ranges":[[{"subnet":"10.9.0.0/24"}]],"dataDir":%q}}]}`, network, t.TempDir()), 0o644), "writing the conflist")
	villaged := filepath.Join(testenv.Bins(t), "villaged")
	ask := func() (floodReport, error) {
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(l.Node.Path()), villaged, "drops", "--json",
			"--conf", conf, "--node-name", "node", "--run-dir", run).CombinedOutput()
		if err != nil {
			return floodReport{}, fmt.Errorf("villaged drops: %v: %s", err, out)
		}
		var r floodReport
		if err := json.Unmarshal(out, &r); err != nil {
			return floodReport{}, fmt.Errorf("villaged drops --json: %v: %s", err, out)
		}
		if r.CountsError != "" {
			return floodReport{}, fmt.Errorf("villaged drops read no counts: %s", r.CountsError)
		}
		return r, nil
	}
	r0, err := ask()
	must(t, err, "before the flood")
	before, ok := r0.ingress("ns/victim")
	if !ok {
		t.Fatalf("villaged drops has no count of ns/victim's ingress chain: %+v", r0)
	}

	// the flood, and `villaged drops` asked while it lasts
	var (
		mu      sync.Mutex
		answers []floodReport
		askErrs []error
	)
	flooding := make(chan struct{})
	asked := make(chan struct{})
	go func() {
		defer close(asked)
		for {
			select {
			case <-flooding:
				return
			default:
			}
			r, err := ask()
			mu.Lock()
			if err != nil {
				askErrs = append(askErrs, err)
			} else {
				answers = append(answers, r)
			}
			mu.Unlock()
		}
	}()
	start := time.Now()
	sent, err := flood(l, "attacker", []string{l.V4["victim"], l.V6["victim"]}, 9999, n)
	elapsed := time.Since(start)
	close(flooding)
	<-asked
	must(t, err, "the flood (%d datagrams sent)", sent)
	t.Logf("flood: %d datagrams in %v (%.0f a second); villaged drops answered %d times during it", sent, elapsed.Round(time.Millisecond), float64(sent)/elapsed.Seconds(), len(answers))

	// every packet counted
	var r floodReport
	testenv.WaitFor(t, fmt.Sprintf("villaged drops to count %d drops of ns/victim (%d before, %d sent)", before+uint64(sent), before, sent), func() error {
		var err error
		if r, err = ask(); err != nil {
			return err
		}
		c, _ := r.ingress("ns/victim")
		if c > before+uint64(sent) {
			t.Fatalf("ns/victim's ingress chain counts %d drops, %d before and %d sent", c, before, sent)
		}
		if c != before+uint64(sent) {
			return fmt.Errorf("counted %d", c-before)
		}
		return nil
	})

	// the samples: within the kernel's bound, and at least its burst
	// (the listener has them once the file it writes says so)
	bound := uint64(table.SampleRate) + uint64(float64(table.SampleRate)*elapsed.Seconds()) + 1
	least := min(uint64(table.SampleRate), uint64(sent))
	var named *drops.Drop
	testenv.WaitFor(t, fmt.Sprintf("at least %d samples of the flood, named", least), func() error {
		var err error
		if r, err = ask(); err != nil {
			return err
		}
		named = nil
		for i, d := range r.Drops {
			if d.Source.Pod == "ns/attacker" && d.Destination.Pod == "ns/victim" && d.Proto == "udp" && d.Port == 9999 && d.Direction == "ingress" {
				named = &r.Drops[i]
			}
		}
		if r.Samples < least || named == nil {
			return fmt.Errorf("%d samples, drops %+v", r.Samples, r.Drops)
		}
		return nil
	})
	if r.Samples > bound {
		t.Errorf("the listener received %d samples of a %v flood: more than the bound of %d (%d a second, a burst of %d)", r.Samples, elapsed, bound, table.SampleRate, table.SampleRate)
	}
	var sampled uint64
	for _, d := range r.Drops {
		sampled += d.Count
	}
	if sampled != r.Samples {
		t.Errorf("the drops add up to %d samples, the file says %d", sampled, r.Samples)
	}
	t.Logf("samples: %d of %d dropped packets (bound %d); named %s → %s %s/%d %v",
		r.Samples, sent, bound, named.Source, named.Destination, named.Proto, named.Port, named.Policies)

	// responsive during the flood: villaged drops answered, and at least
	// one answer shows a drops file the listener wrote during it
	if len(askErrs) > 0 {
		t.Errorf("villaged drops failed %d times during the flood, first: %v", len(askErrs), askErrs[0])
	}
	written := false
	for _, a := range answers {
		if a.File.After(start) && a.Samples > 0 {
			written = true
		}
	}
	if len(answers) == 0 || !written {
		t.Errorf("during the %v flood villaged drops answered %d times, none with a drops file written during it", elapsed, len(answers))
	}

	// control in the same run: the policy selects only the victim
	l.Reach(t, "attacker", "control", 80, true)
	l.Reach(t, "attacker", "victim", 80, false)
}

// flood sends n UDP datagrams from pod from to port of the addrs in turn,
// as fast as one sender goes, and says how many were sent (a write that
// failed is not).
func flood(l *testenv.PodLab, from string, addrs []string, port, n int) (int, error) {
	sent := 0
	err := testenv.InNS(l.Pods[from], func() error {
		var cs []net.Conn
		defer func() {
			for _, c := range cs {
				c.Close()
			}
		}()
		for _, a := range addrs {
			c, err := net.Dial("udp", net.JoinHostPort(a, fmt.Sprint(port)))
			if err != nil {
				return err
			}
			cs = append(cs, c)
		}
		payload := []byte("flood")
		for i := range n {
			if _, err := cs[i%len(cs)].Write(payload); err != nil {
				return fmt.Errorf("datagram %d to %s: %w", i, addrs[i%len(cs)], err)
			}
			sent++
		}
		return nil
	})
	return sent, err
}

func must(t *testing.T, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf(format+": %v", append(args, err)...)
	}
}
