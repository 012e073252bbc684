package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// PodLab is a test node for policy tests: a netns with bridge br0
// (nf_call_iptables and nf_call_ip6tables on, as Village sets its bridge)
// holding 10.9.0.1/24 and fd09::1/64, and pods on it, each a netns with
// eth0 on the bridge and a TCP server answering "ok" on ports 80 and
// 8080.
type PodLab struct {
	t    testing.TB
	Node ns.NetNS
	Pods map[string]ns.NetNS
	V4   map[string]string
	V6   map[string]string
}

// DialBound is how long a connection whose SYN is dropped is given.
const DialBound = 3 * time.Second

// NewPodLab makes the node and its bridge.
func NewPodLab(t testing.TB) *PodLab {
	l := &PodLab{t: t, Node: NewNS(t), Pods: map[string]ns.NetNS{}, V4: map[string]string{}, V6: map[string]string{}}
	MustIP(t, l.Node, "link", "add", "br0", "type", "bridge", "nf_call_iptables", "1", "nf_call_ip6tables", "1")
	MustIP(t, l.Node, "addr", "add", "10.9.0.1/24", "dev", "br0")
	MustIP(t, l.Node, "addr", "add", "fd09::1/64", "dev", "br0", "nodad")
	MustIP(t, l.Node, "link", "set", "br0", "up")
	if out, err := exec.Command("ip", "netns", "exec", filepath.Base(l.Node.Path()), "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v: %s", err, out)
	}
	if v4, v6 := BridgeNfCalls(t, l.Node, "br0"); v4 != 1 || v6 != 1 {
		t.Fatalf("bridge nf_call options %d %d", v4, v6)
	}
	return l
}

// AddPod makes pod name with address number n (10.9.0.n, fd09::n) and
// its servers; with up false its eth0 stays down until Up.
func (l *PodLab) AddPod(name string, n int, up bool) {
	t := l.t
	p := NewNS(t)
	l.Pods[name] = p
	l.V4[name] = fmt.Sprintf("10.9.0.%d", n)
	l.V6[name] = fmt.Sprintf("fd09::%x", n)
	host := "veth-" + name
	MustIP(t, l.Node, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", p.Path())
	MustIP(t, l.Node, "link", "set", host, "master", "br0", "up")
	MustIP(t, p, "addr", "add", l.V4[name]+"/24", "dev", "eth0")
	MustIP(t, p, "addr", "add", l.V6[name]+"/64", "dev", "eth0", "nodad")
	for _, port := range []int{80, 8080} {
		ServeTCP(t, p, fmt.Sprintf("[::]:%d", port), "ok")
	}
	if up {
		l.Up(name)
	}
}

// Up brings pod name's eth0 up with its default routes.
func (l *PodLab) Up(name string) {
	p := l.Pods[name]
	MustIP(l.t, p, "link", "set", "eth0", "up")
	MustIP(l.t, p, "route", "add", "default", "via", "10.9.0.1")
	MustIP(l.t, p, "-6", "route", "add", "default", "via", "fd09::1")
}

// Dial connects from netns n to addr:port and reads the server's answer.
func Dial(n ns.NetNS, addr string, port int, bound time.Duration) error {
	return InNS(n, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, fmt.Sprint(port)), bound)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(bound))
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "ok" {
			return fmt.Errorf("answer %q: %v", b, err)
		}
		return nil
	})
}

// Reach asserts whether from ("node" or a pod) reaches pod to on port,
// over IPv4 and IPv6 at once; denied means silently dropped.
func (l *PodLab) Reach(t *testing.T, from, to string, port int, want bool) {
	t.Helper()
	errs := make(chan string, 2)
	for _, addrs := range []map[string]string{l.V4, l.V6} {
		go func() { errs <- l.check(from, addrs[to], port, want) }()
	}
	for range 2 {
		if msg := <-errs; msg != "" {
			t.Errorf("%s -> %s %s", from, to, msg)
		}
	}
}

func (l *PodLab) check(from, dst string, port int, want bool) string {
	src := l.Node
	if from != "node" {
		src = l.Pods[from]
	}
	err := Dial(src, dst, port, DialBound)
	var ne net.Error
	switch {
	case want && err != nil:
		return fmt.Sprintf("(%s) port %d: want allowed, got %v", dst, port, err)
	case !want && err == nil:
		return fmt.Sprintf("(%s) port %d: want denied, got through", dst, port)
	case !want && !(errors.As(err, &ne) && ne.Timeout()):
		return fmt.Sprintf("(%s) port %d: want a silent drop, got %v", dst, port, err)
	}
	return ""
}

// Nft runs nft inside n and returns its output.
func Nft(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(n.Path()), "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

// SendUDP sends n datagrams from netns from to addr:port.
func SendUDP(from ns.NetNS, addr string, port, n int) error {
	return InNS(from, func() error {
		c, err := net.Dial("udp", net.JoinHostPort(addr, fmt.Sprint(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.Write([]byte("x")); err != nil {
				return err
			}
		}
		return nil
	})
}
