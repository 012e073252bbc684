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
		if err == nil && strings.Contains(string(b), "mdnsdemo") {
			t.Errorf("demo.sh left a process behind: %s %q", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
