package owner

import "testing"

func TestMetric(t *testing.T) {
	for _, tc := range []struct {
		proto   uint8
		network string
		want    int
	}{
		{0x56, "", 0x561c9dc5}, // FNV-1a of nothing is its offset basis 0x811c9dc5
		{0x56, "net-vx", 0x56000000 | int(Tag("net-vx"))},
		{0x57, "net-vx", 0x57000000 | int(Tag("net-vx"))},
	} {
		if got := Metric(tc.proto, tc.network); got != tc.want {
			t.Errorf("Metric(%#x, %q) = %#x, want %#x", tc.proto, tc.network, got, tc.want)
		}
	}
	if Tag("a") == Tag("b") || Tag("village") == Tag("village2") {
		t.Error("distinct names share a tag")
	}
	if Tag("net") > 0xffffff {
		t.Error("tag wider than 24 bits")
	}
}
