package overlay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/overlay"
)

// goldenPeer is one peer of the random model, independent of the package.
type goldenPeer struct {
	i      int
	onLAN  bool // underlay address on node1's subnet
	v6Pods bool // has an IPv6 pod subnet too
	mac    string
}

func (p goldenPeer) ip() string {
	if p.onLAN {
		return fmt.Sprintf("192.168.77.%d", 100+p.i)
	}
	return fmt.Sprintf("10.55.%d.1", p.i)
}

func (p goldenPeer) node() overlay.Node {
	n := overlay.Node{Name: fmt.Sprintf("peer%02d", p.i), IP: net.ParseIP(p.ip()).To4()}
	n.PodCIDRs = append(n.PodCIDRs, &net.IPNet{IP: net.IPv4(10, 250, byte(p.i), 0).To4(), Mask: net.CIDRMask(24, 32)})
	if p.v6Pods {
		n.PodCIDRs = append(n.PodCIDRs, &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd50:%x::", p.i)), Mask: net.CIDRMask(64, 128)})
	}
	if p.mac != "" {
		n.VtepMAC, _ = net.ParseMAC(p.mac)
	}
	return n
}

// expect is the kernel state the model says mode should produce.
func expect(mode overlay.Mode, peers []goldenPeer) kernelState {
	var st kernelState
	fdb := map[string]bool{}
	for _, p := range peers {
		mac := p.mac
		if mac == "" {
			mac = derived(p.ip())
		}
		subnets := [][2]string{{fmt.Sprintf("10.250.%d.0/24", p.i), fmt.Sprintf("10.250.%d.0", p.i)}}
		if p.v6Pods {
			gw := net.ParseIP(fmt.Sprintf("fd50:%x::", p.i)).String() // iproute2 prints canonical IPv6
			subnets = append(subnets, [2]string{gw + "/64", gw})
		}
		for k, s := range subnets {
			if mode == overlay.ModeHostGW || (mode == overlay.ModeAuto && p.onLAN && k == 0) {
				st.Routes = append(st.Routes, fmt.Sprintf("%s via %s dev eth0", s[0], p.ip()))
				continue
			}
			st.Routes = append(st.Routes, fmt.Sprintf("%s via %s dev village.1 onlink", s[0], s[1]))
			st.Neighs = append(st.Neighs, s[1]+" "+mac)
			fdb[mac+" "+p.ip()] = true
		}
	}
	for k := range fdb {
		st.FDB = append(st.FDB, k)
	}
	return st.sorted()
}

// derived is 0e:76 + the IPv4 address, written out independently of DeriveMAC.
func derived(ip string) string {
	parts := strings.Split(ip, ".")
	s := "0e:76"
	for _, p := range parts {
		v, _ := strconv.Atoi(p)
		s += fmt.Sprintf(":%02x", v)
	}
	return s
}

// TestGolden feeds random sequences of desired peer sets, in random order,
// and compares the kernel's state with the model after every step; a repeat
// of each Set must write nothing and Status must be clean.
func TestGolden(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("OVERLAY_GOLDEN_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (rerun with OVERLAY_GOLDEN_SEED=%d)", seed, seed)
	for _, mode := range []overlay.Mode{overlay.ModeVXLAN, overlay.ModeAuto, overlay.ModeHostGW} {
		t.Run(string(mode), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(len(mode))))
			segs := newSegments(t, 1)
			n := addNode(t, segs, 0, 1)
			r := newReconciler(t, n.ns, overlay.Config{Mode: mode})
			self := n.node(false)
			for step := range 25 {
				peers := randomPeers(rng, mode)
				in := make([]overlay.Node, len(peers))
				for i, p := range peers {
					in[i] = p.node()
				}
				rng.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
				ctx := context.Background()
				if _, err := r.Set(ctx, self, in); err != nil {
					t.Fatalf("step %d: Set: %v", step, err)
				}
				got, want := readState(t, n.ns, "village.1"), expect(mode, peers)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("step %d (seed %d): kernel state\n%s\nwant\n%s", step, seed, dump(got), dump(want))
				}
				if rep, err := r.Set(ctx, self, in); err != nil || len(rep.Applied) != 0 {
					t.Fatalf("step %d: repeated Set applied %v, %v", step, rep.Applied, err)
				}
				if d, err := r.Status(ctx, self, in); err != nil || !d.Clean() {
					t.Fatalf("step %d: Status after Set: %v, %v", step, d, err)
				}
				if step%5 == 4 {
					damage(t, n, rng)
				}
			}
		})
	}
}

// randomPeers picks a random subset of 12 peers with random attributes.
func randomPeers(rng *rand.Rand, mode overlay.Mode) []goldenPeer {
	var out []goldenPeer
	for i := range 12 {
		if rng.IntN(3) == 0 {
			continue
		}
		p := goldenPeer{i: i, onLAN: rng.IntN(2) == 0, v6Pods: rng.IntN(2) == 0}
		if rng.IntN(4) == 0 {
			p.mac = fmt.Sprintf("0e:aa:00:00:%02x:%02x", i, rng.IntN(3))
		}
		if mode == overlay.ModeHostGW {
			p.onLAN, p.v6Pods = true, false
		}
		out = append(out, p)
	}
	return out
}

// damage deletes one owned route by hand; the next Set must restore it.
func damage(t *testing.T, n *labNode, rng *rand.Rand) {
	out := testenv.MustIP(t, n.ns, "route", "show", "proto", "86")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || lines[0] == "" {
		return
	}
	dst := strings.Fields(lines[rng.IntN(len(lines))])[0]
	testenv.MustIP(t, n.ns, "route", "del", dst, "proto", "86")
}

func dump(s kernelState) string {
	all := append(append(append([]string{}, s.Routes...), s.Neighs...), s.FDB...)
	sort.Strings(all)
	return "  " + strings.Join(all, "\n  ")
}
