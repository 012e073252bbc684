package testenv

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

// LAN is a bridge in a namespace of its own, standing for a home LAN;
// its hosts are namespaces with an interface on it.
type LAN struct {
	t  testing.TB
	NS ns.NetNS
	n  int
}

// NewLAN makes the LAN's namespace and bridge br0; both go when the test
// ends.
func NewLAN(t testing.TB) *LAN {
	t.Helper()
	l := &LAN{t: t, NS: NewNS(t)}
	MustIP(t, l.NS, "link", "add", "br0", "type", "bridge")
	MustIP(t, l.NS, "link", "set", "br0", "up")
	return l
}

// LANHost is one host's interface on a LAN.
type LANHost struct {
	NS     ns.NetNS
	IfName string
	Port   string // the bridge port of its interface, in the LAN's namespace
	MAC    net.HardwareAddr
}

// Host puts a new namespace on the LAN (see Attach).
func (l *LAN) Host(ifname string, addrs ...string) *LANHost {
	return l.Attach(NewNS(l.t), ifname, addrs...)
}

// Attach gives n an interface ifname on the LAN holding addrs (prefix
// forms; IPv6 ones skip duplicate detection), and returns once its
// link-local address is usable, so the kernel can source neighbour
// discovery from it.
func (l *LAN) Attach(n ns.NetNS, ifname string, addrs ...string) *LANHost {
	t := l.t
	t.Helper()
	l.n++
	h := &LANHost{NS: n, IfName: ifname, Port: fmt.Sprintf("p%d", l.n)}
	MustIP(t, l.NS, "link", "add", h.Port, "type", "veth", "peer", "name", ifname, "netns", filepath.Base(n.Path()))
	MustIP(t, l.NS, "link", "set", h.Port, "master", "br0", "up")
	for _, a := range addrs {
		args := []string{"addr", "add", a, "dev", ifname}
		if strings.Contains(a, ":") {
			args = append(args, "nodad")
		}
		MustIP(t, n, args...)
	}
	MustIP(t, n, "link", "set", ifname, "up")
	if err := InNS(n, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		h.MAC = ifi.HardwareAddr
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var out string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		out, _ = IP(n, "-6", "addr", "show", "dev", ifname, "scope", "link")
		if strings.Contains(out, "fe80::") && !strings.Contains(out, "tentative") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("link-local address of %s in %s not usable within a minute: %s", ifname, n.Path(), out)
		}
	}
	return h
}

// Unplug takes the host's bridge port down: its interface loses carrier,
// as when a cable is pulled.
func (l *LAN) Unplug(h *LANHost) { MustIP(l.t, l.NS, "link", "set", h.Port, "down") }

// Plug puts the host's bridge port back up.
func (l *LAN) Plug(h *LANHost) { MustIP(l.t, l.NS, "link", "set", h.Port, "up") }

// ARPAnswers asks once, from ifname inside n, who has ip, and returns
// every distinct MAC that answered within the given time, in order.
func ARPAnswers(n ns.NetNS, ifname string, ip netip.Addr, within time.Duration) ([]string, error) {
	var macs []string
	err := InNS(n, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		c, err := arp.Dial(ifi)
		if err != nil {
			return fmt.Errorf("ARP socket on %s: %w", ifname, err)
		}
		defer c.Close()
		if err := c.Request(ip); err != nil {
			return fmt.Errorf("ARP request for %s: %w", ip, err)
		}
		seen := map[string]bool{}
		if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
			return err
		}
		for {
			p, _, err := c.Read()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					return nil
				}
				continue
			}
			mac := p.SenderHardwareAddr.String()
			if p.Operation == arp.OperationReply && p.SenderIP == ip && !seen[mac] {
				seen[mac] = true
				macs = append(macs, mac)
			}
		}
	})
	return macs, err
}

// DialerIn returns a TCP dial that runs inside n, whatever thread the
// caller is on: for in-process agents whose nodes are namespaces. Each
// dial opens the namespace by its path: an agent's goroutines may still
// dial while the test's cleanup closes n (memberlist's Shutdown does not
// wait for its probes), and the dial then fails instead of racing on n.
func DialerIn(n ns.NetNS) func(addr string, timeout time.Duration) (net.Conn, error) {
	path := n.Path()
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		var c net.Conn
		err := ns.WithNetNSPath(path, func(ns.NetNS) (err error) {
			c, err = net.DialTimeout("tcp", addr, timeout)
			return err
		})
		return c, err
	}
}

// WaitFor polls f every 5 ms until it returns nil, and returns how long
// that took; it fails the test with f's last error after a minute, a
// bound only a hang reaches.
func WaitFor(t testing.TB, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for deadline := start.Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err = f(); err == nil {
			return time.Since(start)
		}
	}
	t.Fatalf("%s: not within a minute: %v", what, err)
	return 0
}

// NDPAnswers sends one neighbour solicitation for ip (to its
// solicited-node group) from ifname inside n, and returns every distinct
// target link-layer address that answered within the given time, in order:
// ARPAnswers for IPv6.
func NDPAnswers(n ns.NetNS, ifname string, ip netip.Addr, within time.Duration) ([]string, error) {
	var macs []string
	err := InNS(n, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		// The ndp package names the interface as the zone of every
		// destination; the index, as a name, resolves in any namespace.
		byIndex := *ifi
		byIndex.Name = strconv.Itoa(ifi.Index)
		c, _, err := ndp.Listen(&byIndex, ndp.LinkLocal)
		if err != nil {
			return fmt.Errorf("ICMPv6 socket on %s: %w", ifname, err)
		}
		defer c.Close()
		group, err := ndp.SolicitedNodeMulticast(ip)
		if err != nil {
			return err
		}
		ns := &ndp.NeighborSolicitation{TargetAddress: ip, Options: []ndp.Option{
			&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr},
		}}
		if err := c.WriteTo(ns, nil, group.WithZone(strconv.Itoa(ifi.Index))); err != nil {
			return fmt.Errorf("neighbour solicitation for %s: %w", ip, err)
		}
		seen := map[string]bool{}
		if err := c.SetReadDeadline(time.Now().Add(within)); err != nil {
			return err
		}
		for {
			m, _, _, err := c.ReadFrom()
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					return nil
				}
				continue
			}
			na, ok := m.(*ndp.NeighborAdvertisement)
			if !ok || na.TargetAddress != ip {
				continue
			}
			for _, o := range na.Options {
				if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target && !seen[lla.Addr.String()] {
					seen[lla.Addr.String()] = true
					macs = append(macs, lla.Addr.String())
				}
			}
		}
	})
	return macs, err
}
