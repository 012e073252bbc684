package drops

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/village-cni/village/pkg/netpol/table"
)

// v4 is an IPv4 header (ihl 20 + opts bytes of options) of proto, frag
// the fragment offset field, then l4.
func v4(proto byte, opts int, frag uint16, l4 ...byte) []byte {
	b := make([]byte, 20+opts)
	b[0] = 0x40 | byte((20+opts)/4)
	binary.BigEndian.PutUint16(b[6:8], frag)
	b[9] = proto
	copy(b[12:16], []byte{10, 0, 0, 1})
	copy(b[16:20], []byte{10, 0, 0, 2})
	return append(b, l4...)
}

// v6 is an IPv6 header whose next header is next, then rest.
func v6(next byte, rest ...byte) []byte {
	b := make([]byte, 40)
	b[0] = 0x60
	b[6] = next
	a, c := netip.MustParseAddr("fd00::1").As16(), netip.MustParseAddr("fd00::2").As16()
	copy(b[8:24], a[:])
	copy(b[24:40], c[:])
	return append(b, rest...)
}

var ports = []byte{0x30, 0x39, 0x00, 0x35} // 12345 → 53

func TestParse(t *testing.T) {
	a4, b4 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	for _, tc := range []struct {
		name string
		b    []byte
		want Packet
		err  bool
	}{
		{"udp4", v4(17, 0, 0, ports...), Packet{a4, b4, table.ProtoUDP, 12345, 53}, false},
		{"tcp4 with options", v4(6, 8, 0, ports...), Packet{a4, b4, table.ProtoTCP, 12345, 53}, false},
		{"sctp4", v4(132, 0, 0, ports...), Packet{a4, b4, table.ProtoSCTP, 12345, 53}, false},
		{"icmp4", v4(1, 0, 0, 8, 0, 0, 0), Packet{a4, b4, 1, 0, 0}, false},
		{"udp4 later fragment", v4(17, 0, 100, ports...), Packet{a4, b4, table.ProtoUDP, 0, 0}, false},
		{"udp4 cut before the ports", v4(17, 0, 0, 0x30), Packet{a4, b4, table.ProtoUDP, 0, 0}, false},
		{"udp6", v6(17, ports...), Packet{a6, b6, table.ProtoUDP, 12345, 53}, false},
		{"tcp6 after hop-by-hop", v6(0, append([]byte{6, 0, 0, 0, 0, 0, 0, 0}, ports...)...), Packet{a6, b6, table.ProtoTCP, 12345, 53}, false},
		{"udp6 first fragment", v6(44, append([]byte{17, 0, 0, 1, 0, 0, 0, 1}, ports...)...), Packet{a6, b6, table.ProtoUDP, 12345, 53}, false},
		{"udp6 later fragment", v6(44, append([]byte{17, 0, 0, 0x10, 0, 0, 0, 1}, ports...)...), Packet{a6, b6, table.ProtoUDP, 0, 0}, false},
		{"v6 extension cut", v6(60, 17, 3), Packet{a6, b6, 60, 0, 0}, false},
		{"empty", nil, Packet{}, true},
		{"ihl too small", []byte{0x44, 0, 0, 0}, Packet{}, true},
		{"v4 cut", v4(17, 0, 0)[:12], Packet{}, true},
		{"v6 cut", v6(17)[:30], Packet{}, true},
		{"version 5", []byte{0x50, 1, 2}, Packet{}, true},
	} {
		got, err := Parse(tc.b)
		if (err != nil) != tc.err || (err == nil && got != tc.want) {
			t.Errorf("%s: Parse = %+v, %v; want %+v (error %v)", tc.name, got, err, tc.want, tc.err)
		}
	}
}

// FuzzParse: Parse takes any bytes without panicking, and what it reads
// is in them: the addresses at their offsets.
func FuzzParse(f *testing.F) {
	f.Add(v4(17, 0, 0, ports...))
	f.Add(v6(0, append([]byte{6, 0, 0, 0, 0, 0, 0, 0}, ports...)...))
	f.Add(v6(44, append([]byte{17, 0, 0, 1, 0, 0, 0, 1}, ports...)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			return
		}
		switch {
		case p.Src.Is4():
			if p.Src.As4() != [4]byte(b[12:16]) || p.Dst.As4() != [4]byte(b[16:20]) {
				t.Fatalf("addresses %v %v not those of %x", p.Src, p.Dst, b)
			}
		case p.Src.Is6():
			if p.Src.As16() != [16]byte(b[8:24]) || p.Dst.As16() != [16]byte(b[24:40]) {
				t.Fatalf("addresses %v %v not those of %x", p.Src, p.Dst, b)
			}
		default:
			t.Fatalf("no address from %x", b)
		}
	})
}
