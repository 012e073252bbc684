package table

import (
	"fmt"
	"net/netip"
	"testing"
)

type markEvent struct {
	keys []netip.Addr
	del  bool
}

// TestMarksUpdate: element notifications in order leave Marks with what
// the sets hold; keys that are no address are ignored.
func TestMarksUpdate(t *testing.T) {
	a4, b4, a6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::1")
	for _, tc := range []struct {
		name string
		evs  []markEvent
		want string
	}{
		{"nothing", nil, "[]"},
		{"added", []markEvent{{[]netip.Addr{b4, a6, a4}, false}}, "[10.0.0.1 10.0.0.2 fd00::1]"},
		{"added, one unmarked", []markEvent{{[]netip.Addr{a4, a6}, false}, {[]netip.Addr{a4}, true}}, "[fd00::1]"},
		{"unmarked before marked again", []markEvent{{[]netip.Addr{a4}, false}, {[]netip.Addr{a4}, true}, {[]netip.Addr{a4}, false}}, "[10.0.0.1]"},
		{"deleting what is not there", []markEvent{{[]netip.Addr{b4}, true}}, "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMarks("t")
			for _, ev := range tc.evs {
				var keys [][]byte
				for _, a := range ev.keys {
					keys = append(keys, a.AsSlice())
				}
				keys = append(keys, []byte{1, 2, 3}) // no address
				m.Update(keys, ev.del)
			}
			if got := fmt.Sprint(m.Addrs()); got != tc.want {
				t.Fatalf("Addrs %s, want %s", got, tc.want)
			}
		})
	}
	var none *Marks
	if got := none.Addrs(); got != nil {
		t.Fatalf("nil Marks: %v", got)
	}
	if tb, sets := NewMarks("t").Sets(); tb != PendingTable("t") || fmt.Sprint(sets) != "[pending4 pending6]" {
		t.Fatalf("Sets: %s %v", tb, sets)
	}
}
