package wireguard

// The device tests run each test node as its own process: the test binary
// again, started with `ip netns exec` in the node's namespace, so that every
// thread of it, and so every socket wireguard-go opens from its goroutines,
// is in that namespace (see startUserspace). Switching one locked thread
// into a namespace would not do: wireguard-go's UDP and ioctl sockets are
// opened on other threads. The node reads one JSON command a line on stdin
// and answers each with one line on stdout after nodePrefix; it closes its
// device and exits when stdin closes, so a failed or killed test leaves no
// device behind.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

const (
	nodeEnv    = "VILLAGE_WG_TEST_NODE"
	nodePrefix = "WGNODE "
)

func TestMain(m *testing.M) {
	if os.Getenv(nodeEnv) != "" {
		os.Exit(nodeMain(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

type nodeCmd struct {
	Op        string     // ensure, peers, close
	Name      string     `json:",omitempty"`
	KeyFile   string     `json:",omitempty"`
	Port      int        `json:",omitempty"`
	MTU       int        `json:",omitempty"`
	Userspace string     `json:",omitempty"`
	Peers     []nodePeer `json:",omitempty"`
}

type nodePeer struct {
	Key       string
	Endpoint  string   // host:port or ""
	Allowed   []string // CIDRs
	Keepalive time.Duration
}

type nodeReply struct {
	Err       string `json:",omitempty"`
	NoKernel  bool   `json:",omitempty"` // errors.Is(err, ErrNoKernel)
	InUse     bool   `json:",omitempty"` // errors.Is(err, ErrInUse)
	Userspace bool   `json:",omitempty"`
	Public    string `json:",omitempty"`
	Index     int    `json:",omitempty"`
	Changed   int    `json:",omitempty"`
}

func nodeMain(in io.Reader, out io.Writer) int {
	var dev *Device
	defer func() {
		if dev != nil {
			_ = dev.Close()
		}
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var c nodeCmd
		var r nodeReply
		err := json.Unmarshal(sc.Bytes(), &c)
		if err == nil {
			err = nodeDo(&dev, c, &r)
		}
		if err != nil {
			r.Err = err.Error()
			r.NoKernel, r.InUse = errors.Is(err, ErrNoKernel), errors.Is(err, ErrInUse)
		}
		b, _ := json.Marshal(r)
		fmt.Fprintf(out, "%s%s\n", nodePrefix, b)
		if c.Op == "close" {
			return 0
		}
	}
	return 0
}

func nodeDo(dev **Device, c nodeCmd, r *nodeReply) error {
	switch c.Op {
	case "ensure":
		priv, pub, err := LoadOrCreateKey(c.KeyFile)
		if err != nil {
			return err
		}
		d, err := Ensure(DeviceConfig{Name: c.Name, PrivateKey: priv, ListenPort: c.Port, MTU: c.MTU, Userspace: c.Userspace,
			Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }})
		if err != nil {
			return err
		}
		*dev = d
		r.Userspace, r.Public = d.Userspace(), pub.String()
		r.Index, err = d.Index()
		return err
	case "peers":
		if *dev == nil {
			return errors.New("no device")
		}
		var peers []Peer
		for _, p := range c.Peers {
			k, err := wgtypes.ParseKey(p.Key)
			if err != nil {
				return err
			}
			peer := Peer{PublicKey: k, PersistentKeepalive: p.Keepalive}
			if p.Endpoint != "" {
				if peer.Endpoint, err = net.ResolveUDPAddr("udp", p.Endpoint); err != nil {
					return err
				}
			}
			for _, a := range p.Allowed {
				_, n, err := net.ParseCIDR(a)
				if err != nil {
					return err
				}
				peer.AllowedIPs = append(peer.AllowedIPs, *n)
			}
			peers = append(peers, peer)
		}
		var err error
		r.Changed, err = (*dev).SetPeers(peers)
		return err
	case "close":
		if *dev == nil {
			return errors.New("no device")
		}
		err := (*dev).Close()
		*dev = nil
		return err
	}
	return fmt.Errorf("unknown op %q", c.Op)
}

// node is the parent's handle on a node process.
type node struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncBuf
}

// syncBuf is the node's stderr, written by exec's copier while the test
// may read it.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startNode runs a node process in n; it is stopped (stdin closed, then
// killed if it lingers) when the test ends, before n is removed.
func startNode(t *testing.T, n ns.NetNS) *node {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", filepath.Base(n.Path()), exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	nd := &node{t: t, cmd: cmd, stdin: stdin, lines: make(chan string), stderr: &syncBuf{}}
	cmd.Stderr = nd.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(nd.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), nodePrefix); ok {
				nd.lines <- s
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second): // a hung node; the test has failed anyway
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("node in %s did not exit on EOF; killed", n.Path())
		}
		if t.Failed() {
			t.Logf("node in %s stderr:\n%s", n.Path(), nd.stderr.String())
		}
	})
	return nd
}

// do sends one command and returns the node's answer.
func (nd *node) do(c nodeCmd) nodeReply {
	nd.t.Helper()
	b, _ := json.Marshal(c)
	if _, err := fmt.Fprintf(nd.stdin, "%s\n", b); err != nil {
		nd.t.Fatalf("node: %v", err)
	}
	line, ok := <-nd.lines
	if !ok {
		nd.t.Fatalf("node exited during %s; stderr:\n%s", c.Op, nd.stderr.String())
	}
	var r nodeReply
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		nd.t.Fatalf("node answer %q: %v", line, err)
	}
	return r
}

// must is do that fails the test on the node's error.
func (nd *node) must(c nodeCmd) nodeReply {
	nd.t.Helper()
	r := nd.do(c)
	if r.Err != "" {
		nd.t.Fatalf("node %s: %s", c.Op, r.Err)
	}
	return r
}
