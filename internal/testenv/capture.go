package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Capture is a tcpdump running inside a namespace the test made.
type Capture struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// StartCapture runs `tcpdump -e -nn -l -U -p -i iface filter` inside n and
// returns once it listens; it is stopped at the end of the test at the
// latest.
func StartCapture(t testing.TB, n ns.NetNS, iface, filter string) *Capture {
	t.Helper()
	c := &Capture{}
	c.cmd = exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "tcpdump", "-i", iface, "-e", "-nn", "-l", "-U", "-p", filter)
	c.cmd.Stdout = &c.out
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	ready := make(chan string, 1)
	go func() {
		var seen []byte
		buf := make([]byte, 4096)
		for {
			k, err := stderr.Read(buf)
			seen = append(seen, buf[:k]...)
			if bytes.Contains(seen, []byte("listening on")) || err != nil {
				ready <- string(seen)
				_, _ = bytes.NewBuffer(nil).ReadFrom(stderr)
				return
			}
		}
	}()
	select {
	case msg := <-ready:
		if !strings.Contains(msg, "listening on") {
			t.Fatalf("tcpdump did not start: %s", msg)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("tcpdump did not start in 20s")
	}
	return c
}

// Stop ends the capture (once) and returns what tcpdump printed.
func (c *Capture) Stop() string {
	if c.cmd.ProcessState == nil {
		time.Sleep(300 * time.Millisecond) // let the last packets through
		_ = c.cmd.Process.Signal(os.Interrupt)
		_ = c.cmd.Wait()
	}
	return c.out.String()
}
