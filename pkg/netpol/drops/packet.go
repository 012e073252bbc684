package drops

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/village-cni/village/pkg/netpol/table"
)

// Packet is what a sample's headers say.
type Packet struct {
	Src, Dst netip.Addr
	Proto    table.Proto
	// SrcPort and DstPort are the TCP, UDP or SCTP ports (0 for another
	// protocol, or a fragment past the first).
	SrcPort, DstPort uint16
}

var errShort = errors.New("packet too short")

// Parse reads the IPv4 or IPv6 header at the start of b (an NFLOG
// payload of the forward hook starts at the network header), IPv6's
// extension headers, and the ports of TCP, UDP and SCTP. b may be cut
// anywhere past the headers.
func Parse(b []byte) (Packet, error) {
	var p Packet
	if len(b) < 1 {
		return p, errShort
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 {
			return p, errors.New("IPv4 header length below 20")
		}
		if len(b) < ihl {
			return p, errShort
		}
		p.Src, _ = netip.AddrFromSlice(b[12:16])
		p.Dst, _ = netip.AddrFromSlice(b[16:20])
		p.Proto = table.Proto(b[9])
		if binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 {
			return p, nil // a later fragment: no ports
		}
		l4 = b[ihl:]
	case 6:
		if len(b) < 40 {
			return p, errShort
		}
		p.Src, _ = netip.AddrFromSlice(b[8:24])
		p.Dst, _ = netip.AddrFromSlice(b[24:40])
		next, rest, ok := skipExtensions(b[6], b[40:])
		p.Proto = table.Proto(next)
		if !ok {
			return p, nil
		}
		l4 = rest
	default:
		return p, errors.New("neither IPv4 nor IPv6")
	}
	switch p.Proto {
	case table.ProtoTCP, table.ProtoUDP, table.ProtoSCTP:
		if len(l4) >= 4 {
			p.SrcPort, p.DstPort = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
		}
	}
	return p, nil
}

// skipExtensions skips IPv6 extension headers from next on: the upper
// protocol and its header; ok false when it cannot be reached (cut, or a
// later fragment).
func skipExtensions(next byte, b []byte) (byte, []byte, bool) {
	for range 8 { // more than any real packet has
		switch next {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(b) < 2 || len(b) < (int(b[1])+1)*8 {
				return next, nil, false
			}
			next, b = b[0], b[(int(b[1])+1)*8:]
		case 44: // fragment
			if len(b) < 8 {
				return next, nil, false
			}
			if binary.BigEndian.Uint16(b[2:4])&0xfff8 != 0 {
				return b[0], nil, false
			}
			next, b = b[0], b[8:]
		case 51: // authentication header: (len+2) 4-byte words
			if len(b) < 2 || len(b) < (int(b[1])+2)*4 {
				return next, nil, false
			}
			next, b = b[0], b[(int(b[1])+2)*4:]
		default:
			return next, b, true
		}
	}
	return next, nil, false
}
