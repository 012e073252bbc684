package masq

import "testing"

// covers: the same fingerprint, or a look at a later nf_tables generation
// (also across the counter's wrap); never an older generation, another
// spec, or a fingerprint without a generation that differs.
func TestCovers(t *testing.T) {
	const d = "m1234abcdefabcdef@n"
	for _, c := range []struct {
		stamp, seen string
		want        bool
	}{
		{d + "g10", "g10", true},
		{d + "g11", "g10", true},
		{d + "g0", "gffffffff", true},
		{d + "g10", "g11", false},
		{"m1234000000000000@n" + "g11", "g10", false},
		{d + "g11l1.2.", "g10l3.4.", true},
		{d + "g10l1.2.", "g10l3.4.", false},
		{d + "l1.2.", "l3.4.", false},
		{d + "l1.2.", "l1.2.", true},
		{d + "g-", "g10", false},
		{"", "g10", false},
	} {
		if got := covers(c.stamp, d, c.seen); got != c.want {
			t.Errorf("covers(%q, seen %q) = %v, want %v", c.stamp, c.seen, got, c.want)
		}
	}
}

// advanceStamps moves only the items at the given generation and keeps
// each one's legacy part and the other networks' items.
func TestAdvanceStamps(t *testing.T) {
	in := "village:maaaa000000000000@ng1f,mbbbb000000000000@ig1fl1.2.-,mcccc000000000000@ng20,mdddd000000000000@il1.2."
	want := "village:maaaa000000000000@ng20,mbbbb000000000000@ig20l1.2.-,mcccc000000000000@ng20,mdddd000000000000@il1.2."
	if got := advanceStamps(in, 0x1f, 0x20); got != want {
		t.Errorf("advanceStamps:\n got  %s\n want %s", got, want)
	}
	if got := advanceStamps("eth0 uplink", 1, 2); got != "eth0 uplink" {
		t.Errorf("an alias that is not ours changed: %q", got)
	}
}
