package announce

import (
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

func TestAnswerARP(t *testing.T) {
	ours := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	theirs := net.HardwareAddr{2, 0, 0, 0, 0, 2}
	vip := netip.MustParseAddr("192.168.1.200")
	asker := netip.MustParseAddr("192.168.1.5")
	zero := netip.IPv4Unspecified()
	for _, tc := range []struct {
		name string
		op   arp.Operation
		shw  net.HardwareAddr
		sip  netip.Addr
		want bool
	}{
		{"a question from a neighbour", arp.OperationRequest, theirs, asker, true},
		{"a duplicate-address probe", arp.OperationRequest, theirs, zero, true},
		{"our own request seen going out", arp.OperationRequest, ours, asker, false},
		{"another holder's gratuitous request", arp.OperationRequest, theirs, vip, false},
		{"a reply", arp.OperationReply, theirs, asker, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := arp.NewPacket(tc.op, tc.shw, tc.sip, net.HardwareAddr{0, 0, 0, 0, 0, 0}, vip)
			if err != nil {
				t.Fatal(err)
			}
			if got := answerARP(p, ours); got != tc.want {
				t.Fatalf("answerARP = %v, want %v", got, tc.want)
			}
		})
	}
}

// solicitation is an IPv6 packet from src holding a neighbour
// solicitation for target, with the given hop limit.
func solicitation(t testing.TB, src, target netip.Addr, hop byte) []byte {
	body, err := ndp.MarshalMessage(&ndp.NeighborSolicitation{TargetAddress: target})
	if err != nil {
		t.Fatal(err)
	}
	h := make([]byte, 40)
	h[0] = 6 << 4
	h[4], h[5] = byte(len(body)>>8), byte(len(body))
	h[6], h[7] = 58, hop
	s := src.As16()
	copy(h[8:24], s[:])
	d := target.As16()
	copy(h[24:40], d[:])
	return append(h, body...)
}

func TestParseNDP(t *testing.T) {
	src := netip.MustParseAddr("fe80::1")
	vip := netip.MustParseAddr("fd00::200")
	good := solicitation(t, src, vip, 255)
	for _, tc := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"a solicitation", good, true},
		{"from the unspecified address", solicitation(t, netip.IPv6Unspecified(), vip, 255), true},
		{"hop limit below 255 (routed: not NDP)", solicitation(t, src, vip, 64), false},
		{"truncated header", good[:30], false},
		{"payload length past the packet", good[:len(good)-4], false},
		{"IPv4", append([]byte{0x45}, good[1:]...), false},
		{"not ICMPv6", func() []byte { b := append([]byte(nil), good...); b[6] = 17; return b }(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotSrc, m, ok := parseNDP(tc.b)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			ns, isNS := m.(*ndp.NeighborSolicitation)
			if !isNS || ns.TargetAddress != vip || gotSrc != netip.AddrFrom16(([16]byte)(tc.b[8:24])) {
				t.Fatalf("got source %s message %#v", gotSrc, m)
			}
		})
	}
}

func FuzzParseNDP(f *testing.F) {
	f.Add(solicitation(f, netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fd00::200"), 255))
	f.Add([]byte{0x60})
	f.Fuzz(func(t *testing.T, b []byte) {
		src, m, ok := parseNDP(b)
		if ok && (m == nil || !src.Is6()) {
			t.Fatalf("ok with source %v and message %v", src, m)
		}
	})
}
