package wireguard

// The device tests run each test node as its own process (a testenv child:
// the test binary again, started with `ip netns exec` in the node's
// namespace), so that every thread of it, and so every socket wireguard-go
// opens from its goroutines, is in that namespace (see startUserspace).
// Switching one locked thread into a namespace would not do: wireguard-go's
// UDP and ioctl sockets are opened on other threads. The node closes its
// device and exits when the test ends, so a failed test leaves no device
// behind.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/wireguard/userspace"
)

func TestMain(m *testing.M) {
	if testenv.IsChild() {
		nodeMain()
		return
	}
	os.Exit(m.Run())
}

type nodeCmd struct {
	Op        string        // ensure, peers, show, quiet, close
	Quiet     time.Duration `json:",omitempty"` // quiet: quietFor
	Name      string        `json:",omitempty"`
	KeyFile   string        `json:",omitempty"`
	Port      int           `json:",omitempty"`
	MTU       int           `json:",omitempty"`
	Userspace string        `json:",omitempty"`
	Peers     []nodePeer    `json:",omitempty"`
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
	// show: the device's peers by public key
	Peers map[string]shownPeer `json:",omitempty"`
}

type shownPeer struct {
	Keepalive time.Duration
	Handshake bool // a handshake completed
}

func nodeMain() {
	var dev *Device
	defer func() {
		if dev != nil {
			_ = dev.Close()
		}
	}()
	testenv.ServeChild(func(line []byte) (any, bool) {
		var c nodeCmd
		var r nodeReply
		err := json.Unmarshal(line, &c)
		if err == nil {
			err = nodeDo(&dev, c, &r)
		}
		if err != nil {
			r.Err = err.Error()
			r.NoKernel, r.InUse = errors.Is(err, ErrNoKernel), errors.Is(err, ErrInUse)
		}
		return r, c.Op == "close"
	})
}

func nodeDo(dev **Device, c nodeCmd, r *nodeReply) error {
	switch c.Op {
	case "ensure":
		priv, pub, err := LoadOrCreateKey(c.KeyFile)
		if err != nil {
			return err
		}
		d, err := Ensure(DeviceConfig{Name: c.Name, PrivateKey: priv, ListenPort: c.Port, MTU: c.MTU, Userspace: c.Userspace,
			Start: userspace.Start, Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }})
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
	case "quiet":
		quietFor = c.Quiet
		return nil
	case "show":
		if *dev == nil {
			return errors.New("no device")
		}
		ps, err := (*dev).Peers()
		r.Peers = map[string]shownPeer{}
		for _, p := range ps {
			r.Peers[p.PublicKey.String()] = shownPeer{Keepalive: p.PersistentKeepaliveInterval, Handshake: !p.LastHandshakeTime.IsZero()}
		}
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
	t testing.TB
	c *testenv.Child
}

// startNode runs a node process in n, stopped when the test ends.
func startNode(t testing.TB, n ns.NetNS) *node {
	t.Helper()
	return &node{t: t, c: testenv.StartChild(t, n)}
}

// do sends one command and returns the node's answer.
func (nd *node) do(c nodeCmd) nodeReply {
	nd.t.Helper()
	var r nodeReply
	nd.c.Do(c, &r)
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
