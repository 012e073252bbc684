package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Pcap is tcpdump writing every frame of one interface inside a test
// namespace to a file, whole (-s 0), so a test can look for a payload in
// the bytes that crossed (Capture prints headers only).
type Pcap struct {
	t    testing.TB
	cmd  *exec.Cmd
	file string
	done chan struct{}
}

// StartPcap starts the capture and returns once tcpdump listens; it is
// stopped when the test ends at the latest.
func StartPcap(t testing.TB, n ns.NetNS, iface string) *Pcap {
	t.Helper()
	p := &Pcap{t: t, file: filepath.Join(t.TempDir(), "underlay.pcap"), done: make(chan struct{})}
	p.cmd = exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "tcpdump", "-i", iface, "-nn", "-p", "--immediate-mode", "-U", "-Z", "root", "-s", "0", "-w", p.file)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	var head bytes.Buffer
	listening := make(chan bool, 1)
	go func() {
		buf := make([]byte, 4096)
		said := false
		for {
			k, err := stderr.Read(buf)
			head.Write(buf[:k])
			if !said && strings.Contains(head.String(), "listening on") {
				said = true
				listening <- true
			}
			if err != nil {
				if !said {
					listening <- false
				}
				break
			}
		}
		_ = p.cmd.Wait()
		close(p.done)
	}()
	if !<-listening {
		<-p.done
		t.Fatalf("tcpdump did not start: %s", head.String())
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
	})
	return p
}

// Stop ends the capture and returns the file's bytes and tcpdump's reading
// of it, a line per frame.
func (p *Pcap) Stop() ([]byte, []string) {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGINT) // flushes and exits
	<-p.done
	raw, err := os.ReadFile(p.file)
	if err != nil {
		p.t.Fatal(err)
	}
	out, err := exec.Command("tcpdump", "-nn", "-r", p.file).Output()
	if err != nil {
		p.t.Fatalf("reading the capture: %v", err)
	}
	var lines []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return raw, lines
}

// UnderlayChatter matches, in tcpdump's lines, what a link carries on its
// own: ARP, IPv6 neighbour and router discovery, multicast listener and
// IGMP reports.
var UnderlayChatter = regexp.MustCompile(` ARP, | ICMP6, (neighbor|router) (solicitation|advertisement)| ICMP6, multicast listener| > 224\.0\.0\.22: igmp `)

// OnlyCarried fails t unless every line of a capture (Stop's) matches want
// or allowed, at least one matches want, and secret is nowhere in its
// bytes; it returns how many lines matched want. An encryption test's
// check: want the tunnel's packets, allowed the link's own chatter (and
// whatever else the test knows crosses), secret a payload sent through
// the tunnel.
func OnlyCarried(t testing.TB, raw []byte, lines []string, want, allowed *regexp.Regexp, secret string) int {
	t.Helper()
	var n int
	for _, l := range lines {
		switch {
		case want.MatchString(l):
			n++
		case allowed.MatchString(l):
		default:
			t.Errorf("the link carried something else: %s", l)
		}
	}
	if n == 0 {
		t.Errorf("none of the captured packets (%d) is the expected kind", len(lines))
	}
	if bytes.Contains(raw, []byte(secret)) {
		t.Errorf("the plaintext %q crossed the link", secret)
	}
	return n
}
