package testenv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// markerType is the EtherType of the frame Stop sends through the captured
// interface to know that tcpdump has printed everything before it (an
// IEEE "local experimental" type: nothing on a test link speaks it).
const markerType = 0x88b5

// markerSeq makes each marker frame's length unique, so a capture waits for
// its own marker, not one another capture on the same link sent.
var markerSeq atomic.Uint32

// Capture is a tcpdump running inside a namespace the test made.
type Capture struct {
	t     testing.TB
	n     ns.NetNS
	iface string
	cmd   *exec.Cmd

	mu     sync.Mutex
	out    bytes.Buffer // tcpdump's stdout, line-buffered (-l)
	stderr bytes.Buffer // after "listening on": the end-of-run counts
	copied chan struct{}
	result string
}

// StartCapture runs `tcpdump -e -nn -l -U -p -i iface` inside n with filter
// (and the marker frame Stop sends) and returns once it listens; it is
// stopped at the end of the test at the latest.
func StartCapture(t testing.TB, n ns.NetNS, iface, filter string) *Capture {
	t.Helper()
	c := &Capture{t: t, n: n, iface: iface, copied: make(chan struct{})}
	full := fmt.Sprintf("(%s) or (ether proto 0x%x)", filter, markerType)
	c.cmd = exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), "tcpdump", "-i", iface, "-e", "-nn", "-l", "-U", "-p", full)
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.copied
			_ = c.cmd.Wait()
		}
	})
	ready := make(chan string, 1)
	var both sync.WaitGroup
	both.Go(func() { c.copy(stdout, &c.out) })
	both.Go(func() {
		var seen []byte
		buf := make([]byte, 4096)
		for {
			k, err := stderr.Read(buf)
			seen = append(seen, buf[:k]...)
			if bytes.Contains(seen, []byte("listening on")) || err != nil {
				ready <- string(seen)
				c.copy(stderr, &c.stderr)
				return
			}
		}
	})
	go func() { both.Wait(); close(c.copied) }()
	select {
	case msg := <-ready:
		if !strings.Contains(msg, "listening on") {
			t.Fatalf("tcpdump did not start: %s", msg)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("tcpdump did not start in 60s")
	}
	return c
}

// copy appends what r yields to buf under c.mu until r ends.
func (c *Capture) copy(r io.Reader, buf *bytes.Buffer) {
	b := make([]byte, 4096)
	for {
		k, err := r.Read(b)
		c.mu.Lock()
		buf.Write(b[:k])
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Stop ends the capture (once) and returns what tcpdump printed, exactly:
// it sends a marker frame out of the captured interface and stops tcpdump
// only once it has printed that frame. tcpdump reads its socket in order,
// so every packet that crossed the interface before Stop was called has
// been printed by then. Marker frames are left out of the result; a capture
// whose kernel buffer dropped packets fails the test.
func (c *Capture) Stop() string {
	c.t.Helper()
	if c.cmd.ProcessState != nil {
		return c.result
	}
	seq := markerSeq.Add(1) % 1000
	length := 60 + int(seq)
	// The length tcpdump prints for this marker: the frame's on an
	// Ethernet interface; on "any" the cooked header (16 bytes for SLL,
	// 20 for SLL2) stands in for the 14-byte Ethernet one.
	headers := []string{}
	for _, l := range []int{length, length + 2, length + 6} {
		headers = append(headers, fmt.Sprintf("ethertype Unknown (0x%x), length %d:", markerType, l))
	}
	if c.iface != "any" {
		headers = headers[:1]
	}
	header := ""
	if err := c.sendMarker(length); err != nil {
		c.t.Errorf("capture on %s: %v", c.iface, err)
	} else {
		header = c.waitFor(headers)
	}
	_ = c.cmd.Process.Signal(os.Interrupt)
	<-c.copied
	_ = c.cmd.Wait()
	c.mu.Lock()
	out, counts := c.out.String(), c.stderr.String()
	c.mu.Unlock()
	if !strings.Contains("\n"+counts, "\n0 packets dropped by kernel") {
		c.t.Errorf("capture on %s is not complete: %s", c.iface, counts)
	}
	if i := strings.Index(out, header); header != "" && i >= 0 {
		out = out[:strings.LastIndex(out[:i], "\n")+1]
	}
	c.result = withoutMarkers(out)
	return c.result
}

// waitFor polls tcpdump's output until it contains one of ss and returns
// it; 60 s only guards against a hang.
func (c *Capture) waitFor(ss []string) string {
	c.t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		out := c.out.String()
		c.mu.Unlock()
		for _, s := range ss {
			if strings.Contains(out, s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			c.t.Errorf("capture on %s: tcpdump printed no marker frame in 60s", c.iface)
			return ""
		}
	}
}

// sendMarker sends one frame of EtherType markerType and the given length
// out of the captured interface, from and to the interface's own MAC (a
// bridge does not forward it back, a peer drops it).
func (c *Capture) sendMarker(length int) error {
	return c.n.Do(func(ns.NetNS) error {
		ifc, err := markerInterface(c.iface)
		if err != nil {
			return fmt.Errorf("marker frame: %w", err)
		}
		proto := int(htons(markerType))
		fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, proto)
		if err != nil {
			return fmt.Errorf("marker frame socket on %s: %w", c.iface, err)
		}
		defer syscall.Close(fd)
		frame := make([]byte, length)
		copy(frame[0:6], ifc.HardwareAddr)
		copy(frame[6:12], ifc.HardwareAddr)
		binary.BigEndian.PutUint16(frame[12:14], markerType)
		copy(frame[14:], "village capture marker")
		to := &syscall.SockaddrLinklayer{Ifindex: ifc.Index, Protocol: htons(markerType)}
		if err := syscall.Sendto(fd, frame, 0, to); err != nil {
			return fmt.Errorf("sending the marker frame on %s: %w", c.iface, err)
		}
		return nil
	})
}

// markerInterface is the interface the marker leaves by: the captured one,
// or for "any" the first interface that is up and has an Ethernet address.
func markerInterface(name string) (*net.Interface, error) {
	if name != "any" {
		return net.InterfaceByName(name)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for i := range ifs {
		if ifs[i].Flags&net.FlagUp != 0 && ifs[i].Flags&net.FlagLoopback == 0 && len(ifs[i].HardwareAddr) == 6 {
			return &ifs[i], nil
		}
	}
	return nil, fmt.Errorf("no interface is up with an Ethernet address to send it by")
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// withoutMarkers drops the marker frames (their line and tcpdump's hex dump
// of them) that other captures sent on the same link.
func withoutMarkers(out string) string {
	var b strings.Builder
	skipping := false
	for line := range strings.Lines(out) {
		switch {
		case strings.Contains(line, fmt.Sprintf("ethertype Unknown (0x%x)", markerType)):
			skipping = true
		case skipping && strings.HasPrefix(line, "\t0x"):
		default:
			skipping = false
			b.WriteString(line)
		}
	}
	return b.String()
}
