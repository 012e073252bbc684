package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
)

// TestDemo runs the README's first command, scripts/demo.sh, as a user
// would, and checks what it shows: the two nodes' pods reach each other
// over VXLAN, the laptop reaches the LAN pod at its LAN address, the LAN
// pod answers the laptop's mDNS question with that address, and DEL leaves
// nothing. Afterwards none of its namespaces, files or processes is left.
func TestDemo(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts/demo.sh"))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("demo.sh: %v\n%s", err, text)
	}
	lanIP := regexp.MustCompile(`net1 (192\.168\.50\.2\d\d) `).FindStringSubmatch(text)
	if lanIP == nil {
		t.Fatalf("demo.sh showed no LAN address for its LAN pod:\n%s", text)
	}
	for _, want := range []string{
		"-pod-b -> ",
		"laptop -> " + lanIP[1] + " ok",
		"laptop: village-demo.local is at " + lanIP[1] + " (answered by " + lanIP[1] + ")",
		"address allocations left 0, pod veths left 0, pod macvlans left 0",
		"demo finished: all steps passed",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("demo.sh output lacks %q:\n%s", want, text)
		}
	}
	pid := regexp.MustCompile(`vdemo(\d+)-`).FindStringSubmatch(text)
	if pid == nil {
		t.Fatalf("demo.sh named no sandbox:\n%s", text)
	}
	left, _ := filepath.Glob("/run/netns/vdemo" + pid[1] + "-*")
	if len(left) > 0 {
		t.Errorf("demo.sh left namespaces: %v", left)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && runsDemoBinary(string(b)) {
			t.Errorf("demo.sh left a process behind: %s %q", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// runsDemoBinary reports whether a process's command line (NUL-separated)
// runs the demo's mDNS binary, which demo.sh builds as <its temporary
// directory>/mdnsdemo and starts through "ip netns exec". A "go test" of
// every package names the package path internal/mdnsdemo, which is no
// such process.
func runsDemoBinary(cmdline string) bool {
	for _, arg := range strings.Split(cmdline, "\x00") {
		if filepath.IsAbs(arg) && filepath.Base(arg) == "mdnsdemo" {
			return true
		}
	}
	return false
}

func TestRunsDemoBinary(t *testing.T) {
	for cmdline, want := range map[string]bool{
		"/tmp/vdemo.123/mdnsdemo\x00serve\x00-iface\x00net1\x00":                         true,
		"ip\x00netns\x00exec\x00vdemo1-lanpod\x00/tmp/vdemo.123/mdnsdemo\x00serve\x00":   true,
		"go\x00test\x00-count=1\x00github.com/village-cni/village/internal/mdnsdemo\x00": false,
		"go\x00build\x00-o\x00/tmp/x/other\x00./internal/mdnsdemo\x00":                   false,
		"": false,
	} {
		if got := runsDemoBinary(cmdline); got != want {
			t.Errorf("runsDemoBinary(%q) = %v, want %v", cmdline, got, want)
		}
	}
}
