package testenv

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// BuildTCPRR builds bench/cmd/tcprr (the TCP_RR measurer the benchmarks
// run in namespaces) into a temp dir and returns its path.
func BuildTCPRR(tb testing.TB) string {
	tb.Helper()
	root, err := ModuleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(tb.TempDir(), "tcprr")
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "bench/cmd/tcprr")).CombinedOutput(); err != nil {
		tb.Fatalf("building tcprr: %v: %s", err, out)
	}
	return bin
}

// ServeTCPRR runs `tcprr -listen addr` in n until the test ends and returns
// once it is listening.
func ServeTCPRR(tb testing.TB, n ns.NetNS, bin, addr string) {
	tb.Helper()
	srv := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), bin, "-listen", addr)
	out, err := srv.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.Contains(line, "ready") {
		tb.Fatalf("tcprr -listen %s: %q %v", addr, line, err)
	}
}

// TCPRR runs `tcprr -connect addr` from n for d and returns the
// transactions per second.
func TCPRR(tb testing.TB, n ns.NetNS, bin, addr string, d time.Duration) float64 {
	tb.Helper()
	out, err := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), bin, "-connect", addr, "-t", d.String()).Output()
	if err != nil {
		tb.Fatalf("tcprr -connect %s: %v: %s", addr, err, out)
	}
	var r struct {
		PerSecond float64 `json:"per_second"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		tb.Fatalf("tcprr: %v: %s", err, out)
	}
	return r.PerSecond
}
