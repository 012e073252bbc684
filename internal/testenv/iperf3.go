package testenv

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// ServeIperf3 runs `iperf3 -s` bound to addr on port 5201 in n until the
// test ends and returns once it is listening.
func ServeIperf3(tb testing.TB, n ns.NetNS, addr string) {
	tb.Helper()
	netns := filepath.Base(n.Path())
	srv := exec.Command("ip", "netns", "exec", netns, "iperf3", "-s", "-B", addr, "-p", "5201")
	if err := srv.Start(); err != nil {
		tb.Fatalf("iperf3 -s in %s: %v", netns, err)
	}
	tb.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	WaitFor(tb, "iperf3 listening on "+addr, func() error {
		out, err := exec.Command("ip", "netns", "exec", netns, "ss", "-Htln", "sport", "=", ":5201").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "5201") {
			return fmt.Errorf("not listening yet: %v: %s", err, out)
		}
		return nil
	})
}

// Iperf3 runs `iperf3 -c addr` (one TCP stream, port 5201) from n for d
// and returns the receiver's rate in Gbit/s.
func Iperf3(tb testing.TB, n ns.NetNS, addr string, d time.Duration) float64 {
	tb.Helper()
	secs := strconv.Itoa(max(1, int(d.Seconds())))
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "iperf3", "-c", addr, "-p", "5201", "-t", secs, "-J").Output()
	if err != nil {
		tb.Fatalf("iperf3 -c %s: %v: %s", addr, err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.End.SumReceived.BitsPerSecond <= 0 {
		tb.Fatalf("iperf3 -c %s: no received rate in its report (%v): %s", addr, err, out)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9
}
