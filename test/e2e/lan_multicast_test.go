package e2e

import (
	"bytes"

	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/ipv4"

	"github.com/village-cni/village/internal/testenv"
)

// mcastGroup is a discovery protocol's group: what home-lab pods (media
// servers, Home Assistant) announce themselves and find printers and TVs
// with.
type mcastGroup struct {
	name string
	addr string // group:port
	v6   bool
}

var discoveryGroups = []mcastGroup{
	{"mDNS", "224.0.0.251:5353", false},
	{"SSDP", "239.255.255.250:1900", false},
	{"mDNS over IPv6", "[ff02::fb]:5353", true},
}

// mcastListen joins g on ifName inside n, the way an mDNS or SSDP
// responder does (a real socket, IGMP/MLD join on that interface).
func mcastListen(t *testing.T, n ns.NetNS, ifName string, g mcastGroup) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	must(t, testenv.InNS(n, func() error {
		ifi, err := net.InterfaceByName(ifName)
		if err != nil {
			return err
		}
		network := map[bool]string{false: "udp4", true: "udp6"}[g.v6]
		gaddr, err := net.ResolveUDPAddr(network, g.addr)
		if err != nil {
			return err
		}
		c, err = net.ListenMulticastUDP(network, ifi, gaddr)
		return err
	}), "joining %s on %s", g.name, ifName)
	t.Cleanup(func() { c.Close() })
	return c
}

// mcastSender is a socket in n sending to g. ifName "" leaves the choice
// of interface to the kernel (an application that names none).
func mcastSender(t *testing.T, n ns.NetNS, ifName string, g mcastGroup) func(msg []byte) error {
	t.Helper()
	var send func([]byte) error
	must(t, testenv.InNS(n, func() error {
		if g.v6 {
			dst, err := net.ResolveUDPAddr("udp6", g.addr)
			if err != nil {
				return err
			}
			dst.Zone = ifName // link-local groups need their interface
			c, err := net.ListenUDP("udp6", &net.UDPAddr{})
			if err != nil {
				return err
			}
			t.Cleanup(func() { c.Close() })
			send = func(b []byte) error { _, err := c.WriteToUDP(b, dst); return err }
			return nil
		}
		dst, err := net.ResolveUDPAddr("udp4", g.addr)
		if err != nil {
			return err
		}
		c, err := net.ListenUDP("udp4", &net.UDPAddr{})
		if err != nil {
			return err
		}
		t.Cleanup(func() { c.Close() })
		if ifName != "" {
			ifi, err := net.InterfaceByName(ifName)
			if err != nil {
				return err
			}
			if err := ipv4.NewPacketConn(c).SetMulticastInterface(ifi); err != nil {
				return err
			}
		}
		send = func(b []byte) error { _, err := c.WriteToUDP(b, dst); return err }
		return nil
	}), "multicast sender for %s in %s", g.name, ifName)
	return send
}

// mcastReaches sends msg with send until recv reads it (a multicast
// datagram can be sent before the join reached the switch: resending until
// it arrives is how discovery protocols work too), within a generous
// bound.
func mcastReaches(t *testing.T, what string, send func([]byte) error, recv *net.UDPConn) {
	t.Helper()
	msg := []byte(fmt.Sprintf("village %s %s", what, randHex(4)))
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 1500)
		for {
			_ = recv.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, _, err := recv.ReadFromUDP(buf)
			if err != nil {
				got <- err
				return
			}
			if bytes.Equal(buf[:n], msg) {
				got <- nil
				return
			}
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := send(msg); err != nil {
			t.Fatalf("%s: send: %v", what, err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("%s: nothing arrived: %v", what, err)
			}
			return
		case <-tick.C:
		}
	}
}

// waitLinkLocal waits until ifName in n has a usable (not tentative) IPv6
// link-local address: MLD and link-local multicast need one.
func waitLinkLocal(t *testing.T, n ns.NetNS, ifName string) {
	t.Helper()
	waitFor(t, 30*time.Second, "IPv6 link-local address on "+ifName, func() (bool, string) {
		out, err := testenv.IP(n, "-6", "addr", "show", "dev", ifName, "scope", "link")
		return err == nil && strings.Contains(out, "fe80::") && !strings.Contains(out, "tentative"), out
	})
}

// TestLANMulticast: with a macvlan LAN interface, a LAN host's mDNS and
// SSDP multicast (IPv4 and IPv6) reaches a pod listening on net1, and the
// pod's reaches the LAN host, through real multicast sockets and group
// joins in the namespaces.
func TestLANMulticast(t *testing.T) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", "192.168.77.5/24")
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	l := ConfList(t, lanList(n, "lanmc", "10.53.1.0/24", "192.168.77.200", "192.168.77.203", ""))
	p := n.NewPod()
	n.MustAdd(l, p)
	t.Cleanup(func() { _ = n.Del(l, p) })
	waitLinkLocal(t, host, "eth0")
	waitLinkLocal(t, p.NS, "net1")

	for _, g := range discoveryGroups {
		t.Run(g.name, func(t *testing.T) {
			inPod := mcastListen(t, p.NS, "net1", g)
			mcastReaches(t, "LAN host -> pod", mcastSender(t, host, "eth0", g), inPod)
			onLAN := mcastListen(t, host, "eth0", g)
			mcastReaches(t, "pod -> LAN host", mcastSender(t, p.NS, "net1", g), onLAN)
		})
	}
	// An application that names no interface (many SSDP and mDNS
	// libraries): the pod's IPv4 multicast route takes it to the LAN,
	// not to eth0's bridge, where nothing listens.
	ssdp := discoveryGroups[1]
	onLAN := mcastListen(t, host, "eth0", ssdp)
	mcastReaches(t, "pod (no interface named) -> LAN host", mcastSender(t, p.NS, "", ssdp), onLAN)
}
