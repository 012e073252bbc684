package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// arpSide is the IPv4 half: one ARP packet socket on the LAN interface.
type arpSide struct {
	c   *arp.Client
	mac net.HardwareAddr
}

func openARP(ifi *net.Interface) (*arpSide, error) {
	c, err := arp.Dial(ifi)
	if err != nil {
		return nil, fmt.Errorf("announce: ARP socket on %s: %w", ifi.Name, err)
	}
	return &arpSide{c: c, mac: ifi.HardwareAddr}, nil
}

func (s *arpSide) close() error { return s.c.Close() }

// gratuitous sends both forms of gratuitous ARP for ip to the broadcast
// address: a request (target hardware address zero, RFC 5227's
// announcement) and a reply (target hardware address ours), since hosts
// and routers differ in which of the two updates an existing entry.
func (s *arpSide) gratuitous(ip netip.Addr) error {
	req, err := arp.NewPacket(arp.OperationRequest, s.mac, ip, ethernet.Broadcast, ip)
	if err != nil {
		return fmt.Errorf("gratuitous ARP request for %s: %w", ip, err)
	}
	// RFC 5227 2.3: the target hardware address of an announcement is
	// ignored and should be zero.
	req.TargetHardwareAddr = make(net.HardwareAddr, 6)
	rep, err := arp.NewPacket(arp.OperationReply, s.mac, ip, s.mac, ip)
	if err != nil {
		return fmt.Errorf("gratuitous ARP reply for %s: %w", ip, err)
	}
	return errors.Join(
		wrap(s.c.WriteTo(req, ethernet.Broadcast), "gratuitous ARP request for %s", ip),
		wrap(s.c.WriteTo(rep, ethernet.Broadcast), "gratuitous ARP reply for %s", ip),
	)
}

// probe sends an RFC 5227 probe for ip: a request from the unspecified
// address, so no host's cache learns anything from it, which the holder
// of ip answers.
func (s *arpSide) probe(ip netip.Addr) error {
	p, err := arp.NewPacket(arp.OperationRequest, s.mac, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), ip)
	if err != nil {
		return fmt.Errorf("ARP probe for %s: %w", ip, err)
	}
	return wrap(s.c.WriteTo(p, ethernet.Broadcast), "ARP probe for %s", ip)
}

// serveARP answers ARP requests for held addresses, and notes any other
// host's answer or announcement for an address being probed, until the
// socket is closed.
func (a *Announcer) serveARP() {
	for {
		p, _, err := a.v4.c.Read()
		if err != nil {
			if a.isClosed() {
				return
			}
			// A frame the library cannot parse (not Ethernet/IPv4 ARP)
			// is not the end of the socket.
			continue
		}
		switch {
		case p.SenderIP.IsValid() && !p.SenderIP.IsUnspecified():
			// An answer, an announcement or any use of the address as
			// a sender: a claim (RFC 5227 2.1.1, 2.4).
			a.contest(p.SenderIP, p.SenderHardwareAddr, false)
		case p.Operation == arp.OperationRequest && p.TargetIP.IsValid():
			// Another host's probe (sender 0.0.0.0) for the address.
			a.contest(p.TargetIP, p.SenderHardwareAddr, true)
		}
		if !answerARP(p, a.v4.mac) || !a.holds(p.TargetIP) {
			continue
		}
		if err := a.v4.c.Reply(p, a.v4.mac, p.TargetIP); err != nil {
			a.count(func(c *Counters) { c.SendFailures++ })
			a.log.Warn("answering ARP", "address", p.TargetIP, "asker", p.SenderIP, "err", err)
			continue
		}
		a.count(func(c *Counters) { c.ARPReplies++ })
	}
}

// answerARP says whether p is a request that deserves an answer from a
// node whose LAN MAC is mac: a request from someone else, asking for an
// address that is not its own sender address (a gratuitous announcement
// or a duplicate-address probe from another holder is not a question).
// A probe (sender 0.0.0.0, RFC 5227) is answered: it asks whether the
// address is in use, and it is.
func answerARP(p *arp.Packet, mac net.HardwareAddr) bool {
	if p.Operation != arp.OperationRequest {
		return false
	}
	if macEqual(p.SenderHardwareAddr, mac) {
		return false // our own frame, seen going out
	}
	return p.SenderIP != p.TargetIP
}

func (a *Announcer) isClosed() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

func macEqual(x, y net.HardwareAddr) bool { return string(x) == string(y) }

func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
