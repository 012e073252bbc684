package macvlan

import "testing"

func TestStableMAC(t *testing.T) {
	a := StableMAC("village", "media", "db-0")
	if a.String() != StableMAC("village", "media", "db-0").String() {
		t.Fatal("StableMAC is not deterministic")
	}
	if len(a) != 6 || a[0]&0x02 == 0 || a[0]&0x01 != 0 {
		t.Fatalf("%s: want a 6-byte locally administered unicast MAC", a)
	}
	seen := map[string]string{a.String(): "village media db-0"}
	for _, o := range [][3]string{{"other", "media", "db-0"}, {"village", "media2", "db-0"}, {"village", "media", "db-1"}, {"village", "mediad", "b-0"}} {
		m := StableMAC(o[0], o[1], o[2]).String()
		if prev, ok := seen[m]; ok {
			t.Fatalf("%v and %s share MAC %s", o, prev, m)
		}
		seen[m] = o[0] + " " + o[1] + " " + o[2]
	}
}
