package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// ndpSide is the IPv6 half. Solicitations are read from a packet socket on
// the LAN interface, not from the ICMPv6 socket: a neighbour checking that
// a held address is still reachable sends its solicitation to that very
// address, which is on no interface of the node, so the kernel never
// delivers it locally; a packet socket sees the frame all the same. The
// ICMPv6 socket sends the advertisements (the kernel fills in the source
// and the checksum) and holds the solicited-node group memberships, so the
// interface accepts the multicast solicitations; it reads nothing.
type ndpSide struct {
	c    *ndp.Conn
	rx   *packet.Conn
	ifi  *net.Interface
	zone string // the interface's index: a name would be looked up in the calling thread's namespace

	mu     sync.Mutex
	groups map[netip.Addr]int // solicited-node group -> held addresses in it
}

// nsFilter accepts IPv6 packets whose next header is ICMPv6 and whose
// ICMPv6 type is a neighbour solicitation or advertisement (RFC 4861 4.3,
// 4.4; they carry no extension header): solicitations to answer, and
// advertisements that show another host holding an address being probed.
var nsFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadAbsolute{Off: 6, Size: 1}, // next header
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 58, SkipTrue: 4},
	bpf.LoadAbsolute{Off: 40, Size: 1}, // ICMPv6 type
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(ipv6.ICMPTypeNeighborSolicitation), SkipTrue: 1},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(ipv6.ICMPTypeNeighborAdvertisement), SkipTrue: 1},
	bpf.RetConstant{Val: 1 << 16},
	bpf.RetConstant{Val: 0},
})

func mustAssemble(insns []bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(insns)
	if err != nil {
		panic(err)
	}
	return raw
}

func openNDP(ifi *net.Interface) (*ndpSide, error) {
	// The ndp package names the interface as the zone of every
	// destination, and Go looks a zone name up in the namespace of the
	// thread that sends: the index, as a name, means this interface
	// wherever the sending goroutine runs.
	byIndex := *ifi
	byIndex.Name = strconv.Itoa(ifi.Index)
	c, _, err := ndp.Listen(&byIndex, ndp.Unspecified)
	if err != nil {
		return nil, fmt.Errorf("announce: ICMPv6 socket on %s: %w", ifi.Name, err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true) // send only
	if err := c.SetICMPFilter(&f); err != nil {
		c.Close()
		return nil, fmt.Errorf("announce: ICMPv6 filter on %s: %w", ifi.Name, err)
	}
	rx, err := packet.Listen(ifi, packet.Datagram, unix.ETH_P_IPV6, &packet.Config{Filter: nsFilter})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("announce: packet socket for neighbour solicitations on %s: %w", ifi.Name, err)
	}
	return &ndpSide{c: c, rx: rx, ifi: ifi, zone: strconv.Itoa(ifi.Index), groups: map[netip.Addr]int{}}, nil
}

func (s *ndpSide) close() error { return errors.Join(s.c.Close(), s.rx.Close()) }

// solicitedNode is ip's solicited-node multicast group (RFC 4291 2.7.1).
func solicitedNode(ip netip.Addr) (netip.Addr, error) {
	g, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("solicited-node group of %s: %w", ip, err)
	}
	return g, nil
}

// join makes the interface accept the solicited-node group of ip, where
// neighbours send their multicast solicitations for it. Held addresses
// may share a group (same low 24 bits), hence the count.
func (s *ndpSide) join(ip netip.Addr) error {
	g, err := solicitedNode(ip)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[g] == 0 {
		if err := s.c.JoinGroup(g); err != nil {
			return fmt.Errorf("join %s on %s for %s: %w", g, s.ifi.Name, ip, err)
		}
	}
	s.groups[g]++
	return nil
}

func (s *ndpSide) leave(ip netip.Addr) error {
	g, err := solicitedNode(ip)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[g] == 0 {
		return nil
	}
	s.groups[g]--
	if s.groups[g] > 0 {
		return nil
	}
	delete(s.groups, g)
	if err := s.c.LeaveGroup(g); err != nil {
		return fmt.Errorf("leave %s on %s for %s: %w", g, s.ifi.Name, ip, err)
	}
	return nil
}

// allNodes is where unsolicited advertisements go (RFC 4861 7.2.6).
var allNodes = netip.MustParseAddr("ff02::1")

// advert is a neighbour advertisement of ip with our MAC. Override is set:
// the point is to replace whatever MAC the LAN had for ip.
func (s *ndpSide) advert(ip netip.Addr, solicited bool) *ndp.NeighborAdvertisement {
	return &ndp.NeighborAdvertisement{
		Solicited:     solicited,
		Override:      true,
		TargetAddress: ip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Target,
			Addr:      s.ifi.HardwareAddr,
		}},
	}
}

// unsolicited sends an unsolicited advertisement of ip to all nodes.
func (s *ndpSide) unsolicited(ip netip.Addr) error {
	dst := allNodes.WithZone(s.zone)
	if err := s.c.WriteTo(s.advert(ip, false), s.cm(), dst); err != nil {
		return fmt.Errorf("unsolicited advertisement of %s on %s: %w", ip, s.ifi.Name, err)
	}
	return nil
}

// probe asks the LAN who holds ip as RFC 4862 5.4.2's duplicate address
// detection does: a solicitation from the unspecified address, with no
// link-layer option, to ip's solicited-node group. The holder answers to
// all nodes, and another host probing at the same moment sees a probe,
// not a claim. The kernel would put a source address of its own on a
// socket's packet, so the packet is built whole and sent on the packet
// socket.
func (s *ndpSide) probe(ip netip.Addr) error {
	g, err := solicitedNode(ip)
	if err != nil {
		return err
	}
	body, err := ndp.MarshalMessageChecksum(&ndp.NeighborSolicitation{TargetAddress: ip}, netip.IPv6Unspecified(), g)
	if err != nil {
		return fmt.Errorf("neighbour solicitation probing %s: %w", ip, err)
	}
	pkt := make([]byte, ipv6.HeaderLen, ipv6.HeaderLen+len(body))
	pkt[0] = 6 << 4
	pkt[4], pkt[5] = byte(len(body)>>8), byte(len(body))
	pkt[6], pkt[7] = 58, ndp.HopLimit // ICMPv6
	// source: the unspecified address, zero already
	g16 := g.As16()
	copy(pkt[24:40], g16[:])
	pkt = append(pkt, body...)
	// RFC 2464 7: 33:33 and the group's low 32 bits.
	dst := net.HardwareAddr{0x33, 0x33, g16[12], g16[13], g16[14], g16[15]}
	if _, err := s.rx.WriteTo(pkt, &packet.Addr{HardwareAddr: dst}); err != nil {
		return fmt.Errorf("neighbour solicitation probing %s on %s: %w", ip, s.ifi.Name, err)
	}
	return nil
}

// cm sends on the LAN interface with the hop limit NDP requires; the
// kernel picks the source (the interface's link-local address).
func (s *ndpSide) cm() *ipv6.ControlMessage {
	return &ipv6.ControlMessage{HopLimit: ndp.HopLimit, IfIndex: s.ifi.Index}
}

// serveNDP answers neighbour solicitations for held addresses until the
// socket is closed.
func (a *Announcer) serveNDP() {
	s := a.v6
	buf := make([]byte, 1500)
	for {
		n, from, err := s.rx.ReadFrom(buf)
		if err != nil {
			if a.isClosed() {
				return
			}
			continue
		}
		if pa, ok := from.(*packet.Addr); ok && macEqual(pa.HardwareAddr, s.ifi.HardwareAddr) {
			continue // our own frame, seen going out
		}
		src, m, ok := parseNDP(buf[:n])
		if !ok {
			continue
		}
		var mac net.HardwareAddr
		if pa, ok := from.(*packet.Addr); ok {
			mac = pa.HardwareAddr
		}
		if na, isNA := m.(*ndp.NeighborAdvertisement); isNA {
			a.contest(na.TargetAddress, mac, false) // RFC 4862 5.4.4
			continue
		}
		ns, isNS := m.(*ndp.NeighborSolicitation)
		if !isNS {
			continue
		}
		if src.IsUnspecified() {
			a.contest(ns.TargetAddress, mac, true) // another host's DAD, RFC 4862 5.4.3
		} else {
			a.contest(src, mac, false) // another host using the address as its source
		}
		if !a.holds(ns.TargetAddress) {
			continue
		}
		// RFC 4861 7.2.4: a solicitation from the unspecified address
		// (duplicate address detection) is answered to all nodes, not
		// solicited; any other to its source, solicited.
		dst, solicited := src, true
		if src.IsUnspecified() {
			dst, solicited = allNodes, false
		}
		if dst.IsLinkLocalUnicast() || dst.IsLinkLocalMulticast() {
			dst = dst.WithZone(s.zone)
		}
		if err := s.c.WriteTo(s.advert(ns.TargetAddress, solicited), s.cm(), dst); err != nil {
			a.count(func(c *Counters) { c.SendFailures++ })
			a.log.Warn("answering neighbour solicitation", "address", ns.TargetAddress, "asker", src, "err", err)
			continue
		}
		a.count(func(c *Counters) { c.NDPAdverts++ })
	}
}

// parseNDP reads an IPv6 packet holding a neighbour solicitation or
// advertisement: its source address and the message. Anything else, or a
// packet that is not valid NDP (hop limit other than 255, RFC 4861
// 7.1.1), is refused.
func parseNDP(b []byte) (netip.Addr, ndp.Message, bool) {
	if len(b) < ipv6.HeaderLen || b[0]>>4 != 6 || b[6] != 58 || b[7] != ndp.HopLimit {
		return netip.Addr{}, nil, false
	}
	plen := int(b[4])<<8 | int(b[5])
	if ipv6.HeaderLen+plen > len(b) {
		return netip.Addr{}, nil, false
	}
	src := netip.AddrFrom16([16]byte(b[8:24]))
	m, err := ndp.ParseMessage(b[ipv6.HeaderLen : ipv6.HeaderLen+plen])
	if err != nil {
		return netip.Addr{}, nil, false
	}
	switch m.(type) {
	case *ndp.NeighborSolicitation, *ndp.NeighborAdvertisement:
		return src, m, true
	}
	return netip.Addr{}, nil, false
}
