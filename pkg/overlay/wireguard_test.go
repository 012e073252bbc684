package overlay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/wireguard"
	"github.com/village-cni/village/pkg/wireguard/userspace"
)

// Under ModeWireGuard the device runs in the reconciler's own process and
// namespace (wireguard-go opens its sockets from its own goroutines), so
// each lab node runs its reconciler in a testenv child: the test binary in
// the node's namespace, with its own /var/run/wireguard for the UAPI
// socket of a device whose name every node shares.
func TestMain(m *testing.M) {
	if testenv.IsChild() {
		wgNodeMain()
		return
	}
	os.Exit(m.Run())
}

type wgCmd struct {
	Op     string // set, status, update, teardown, key, podmtu
	Config overlay.Config
	Self   overlay.Node
	Peers  []overlay.Node
}

type wgAnswer struct {
	Err      string
	NoKey    bool // errors.Is(err, overlay.ErrNoKey)
	NeedSet  bool // errors.Is(err, overlay.ErrNeedSet)
	Key      string
	MTU      int
	Device   string
	Changes  []string
	Problems []string
}

func wgNodeMain() {
	if err := testenv.PrivateWireGuardRun(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var r *overlay.Reconciler
	defer func() {
		if r != nil {
			_ = r.Close()
		}
	}()
	testenv.ServeChild(func(line []byte) (any, bool) {
		var c wgCmd
		var a wgAnswer
		err := json.Unmarshal(line, &c)
		if err == nil && r == nil {
			c.Config.WireGuard.Logf = func(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }
			c.Config.WireGuard.Start = userspace.Start // as villaged hands it over
			r, err = overlay.New(c.Config)
		}
		if err == nil {
			err = wgNodeDo(r, c, &a)
		}
		if err != nil {
			a.Err = err.Error()
			a.NoKey, a.NeedSet = errors.Is(err, overlay.ErrNoKey), errors.Is(err, overlay.ErrNeedSet)
		}
		return a, false
	})
}

func wgNodeDo(r *overlay.Reconciler, c wgCmd, a *wgAnswer) error {
	ctx := context.Background()
	var rep overlay.Report
	var err error
	switch c.Op {
	case "key":
		k, err := r.WireGuardPublicKey()
		a.Key = k.String()
		return err
	case "podmtu":
		a.MTU, err = r.PodMTU(c.Self)
		return err
	case "status":
		d, err := r.Status(ctx, c.Self, c.Peers)
		for _, ch := range d.Changes {
			a.Changes = append(a.Changes, ch.String())
		}
		for _, p := range d.Problems {
			a.Problems = append(a.Problems, p.Err.Error())
		}
		return err
	case "set":
		rep, err = r.Set(ctx, c.Self, c.Peers)
	case "update":
		rep, err = r.Update(ctx, c.Self, overlay.PeerChange{Updated: c.Peers})
	case "teardown":
		rep, err = r.Teardown(ctx)
	default:
		return fmt.Errorf("unknown op %q", c.Op)
	}
	a.MTU, a.Device = rep.MTU, rep.Device
	for _, ch := range rep.Applied {
		a.Changes = append(a.Changes, ch.String())
	}
	return err
}

type wgNode struct {
	*labNode
	t   *testing.T
	c   *testenv.Child
	cfg overlay.Config
	key wgtypes.Key
}

func (n *wgNode) do(c wgCmd) wgAnswer {
	n.t.Helper()
	c.Config = n.cfg
	var a wgAnswer
	n.c.Do(c, &a)
	return a
}

func (n *wgNode) must(c wgCmd) wgAnswer {
	n.t.Helper()
	a := n.do(c)
	if a.Err != "" {
		n.t.Fatalf("%s on %s: %s", c.Op, n.name, a.Err)
	}
	return a
}

// self is the node as the overlay sees it, with its public key.
func (n *wgNode) self() overlay.Node {
	o := n.node(false)
	o.WireGuardKey = n.key
	return o
}

// Two nodes on one segment under wireguard: each pod reaches the other
// node's pod over IPv4 and IPv6 and a node reaches the other's pods; on the
// underlay only WireGuard's UDP port crosses and the plaintext never does;
// a peer without a key is not routed and still nothing crosses in the
// clear; Teardown removes the device and the routes.
func TestWireGuardBackend(t *testing.T) {
	segs := newSegments(t, 1)
	port := 40000 + os.Getpid()%20000 // the device's name: unique on this machine
	dir := t.TempDir()
	var nodes []*wgNode
	for i := 1; i <= 2; i++ {
		n := &wgNode{labNode: addNode(t, segs, 0, i), t: t}
		n.cfg = overlay.Config{Mode: overlay.ModeWireGuard, Underlay: "eth0", Network: "wgnet", Port: port,
			WireGuard: overlay.WireGuardConfig{KeyFile: filepath.Join(dir, n.name, "wg.key"), Userspace: wireguard.UserspaceAlways}}
		n.c = testenv.StartChild(t, n.ns)
		k, err := wgtypes.ParseKey(n.must(wgCmd{Op: "key"}).Key)
		if err != nil {
			t.Fatal(err)
		}
		n.key = k
		nodes = append(nodes, n)
	}
	n1, n2 := nodes[0], nodes[1]
	all := []overlay.Node{n1.self(), n2.self()}
	dev := overlay.WireGuardDeviceName(port)
	for _, n := range nodes {
		a := n.must(wgCmd{Op: "set", Self: n.self(), Peers: all})
		if a.Device != dev || a.MTU != 1500-60 {
			t.Fatalf("Set on %s: device %q MTU %d, want %s and 1440 (1500 less 60)", n.name, a.Device, a.MTU, dev)
		}
		if m := n.must(wgCmd{Op: "podmtu", Self: n.self()}); m.MTU != 1440 {
			t.Fatalf("PodMTU on %s: %d, want 1440", n.name, m.MTU)
		}
		if st := n.must(wgCmd{Op: "status", Self: n.self(), Peers: all}); len(st.Changes)+len(st.Problems) != 0 {
			t.Fatalf("Status right after Set on %s: %v %v", n.name, st.Changes, st.Problems)
		}
		n.setPodMTU(t, 1440)
	}
	if out := testenv.MustIP(t, n1.ns, "route", "show", "proto", "86"); !strings.Contains(out, "10.244.2.0/24 dev "+dev) {
		t.Fatalf("node1 routes:\n%s\nwant 10.244.2.0/24 dev %s", out, dev)
	}
	if a := n1.do(wgCmd{Op: "update", Self: n1.self(), Peers: []overlay.Node{n2.self()}}); !a.NeedSet {
		t.Fatalf("Update under wireguard: %+v, want ErrNeedSet", a)
	}

	canary := fmt.Sprintf("village-overlay-wireguard-canary-%d", time.Now().UnixNano())
	testenv.ServeTCP(t, n2.pod, "[::]:7777", canary)
	capt := testenv.StartPcap(t, n1.ns, "eth0")
	testenv.WaitFor(t, "pod1 -> pod2 through WireGuard", func() error { return testenv.Ping(n1.pod, n2.pod4, 1) })
	for _, p := range []struct {
		name string
		err  error
	}{
		{"pod1 -> pod2 (IPv6)", testenv.Ping(n1.pod, n2.pod6, 2)},
		{"pod2 -> pod1", testenv.Ping(n2.pod, n1.pod4, 2)},
		{"pod2 -> pod1 (IPv6)", testenv.Ping(n2.pod, n1.pod6, 2)},
		{"node1 -> pod2", testenv.Ping(n1.ns, n2.pod4, 2)},
		{"node1 -> pod2 (IPv6)", testenv.Ping(n1.ns, n2.pod6, 2)},
	} {
		if p.err != nil {
			t.Errorf("%s: %v", p.name, p.err)
		}
	}
	for _, dst := range []string{n2.pod4 + ":7777", "[" + n2.pod6 + "]:7777"} {
		c, err := testenv.DialerIn(n1.pod)(dst, 10*time.Second)
		if err != nil {
			t.Fatalf("TCP to %s: %v", dst, err)
		}
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != canary {
			t.Fatalf("TCP to %s read %q (%v), want the canary", dst, got, err)
		}
	}

	// A peer without a key: not routed, and nothing of it in the clear.
	keyless := n2.self()
	keyless.WireGuardKey = wgtypes.Key{}
	if a := n1.do(wgCmd{Op: "set", Self: n1.self(), Peers: []overlay.Node{n1.self(), keyless}}); !a.NoKey {
		t.Fatalf("Set with a keyless peer: %+v, want ErrNoKey", a)
	}
	if err := testenv.Ping(n1.pod, n2.pod4, 1); err == nil {
		t.Errorf("pod2 answered through a peer whose key node1 does not have")
	}
	raw, lines := capt.Stop()
	checkWireGuardOnly(t, raw, lines, canary, port)

	n1.must(wgCmd{Op: "set", Self: n1.self(), Peers: all})
	testenv.WaitFor(t, "pod1 -> pod2 once the key is back", func() error { return testenv.Ping(n1.pod, n2.pod4, 1) })

	for _, n := range nodes {
		n.must(wgCmd{Op: "teardown"})
		if out := testenv.MustIP(t, n.ns, "route", "show", "proto", "86"); strings.TrimSpace(out) != "" {
			t.Errorf("routes left on %s after Teardown:\n%s", n.name, out)
		}
		if _, err := testenv.IP(n.ns, "link", "show", dev); err == nil {
			t.Errorf("device %s left on %s after Teardown", dev, n.name)
		}
	}
}

// checkWireGuardOnly fails unless every packet of the capture is
// WireGuard's UDP between the nodes' ports (the underlay's own chatter
// aside) and the canary is nowhere in the bytes.
func checkWireGuardOnly(t *testing.T, raw []byte, lines []string, canary string, port int) {
	t.Helper()
	wg := regexp.MustCompile(fmt.Sprintf(`^\S+ IP 192\.168\.77\.1[12]\.%d > 192\.168\.77\.1[12]\.%d: UDP, length \d+$`, port, port))
	n := testenv.OnlyCarried(t, raw, lines, wg, testenv.UnderlayChatter, canary)
	t.Logf("underlay: %d WireGuard packets, no plaintext", n)
}
