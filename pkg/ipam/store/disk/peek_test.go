package disk

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/village-cni/village/pkg/ipam/store"
)

// TestPeek: the read-only listing sees what the store holds, in the
// store's own terms, without creating anything for a network it never saw.
func TestPeek(t *testing.T) {
	root := t.TempDir()
	d := open(t, root)
	a := store.Owner{ContainerID: "ctr-a", IfName: "eth0"}
	claim(t, d, "10.1.0.5", a, 0)
	claim(t, d, "fd00::5", a, 1)
	dir := filepath.Join(root, "net1")
	for name, body := range map[string]string{
		"10.1.0.6":  "ctr-legacy",          // very old host-local: no ifname
		"10.1.0.7":  "not a container id!", // corrupt
		"not-an-ip": "ctr-b\r\neth0",       // not a reservation
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Peek(root, "net1", true)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(x, y Reservation) int { return x.IP.Compare(y.IP) })
	want := []Reservation{
		{IP: mustAddr("10.1.0.5"), Owner: a},
		{IP: mustAddr("10.1.0.6"), Owner: store.Owner{ContainerID: "ctr-legacy"}},
		{IP: mustAddr("10.1.0.7"), Corrupt: true},
		{IP: mustAddr("fd00::5"), Owner: a},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Peek with owners = %+v, want %+v", got, want)
	}
	names, err := Peek(root, "net1", false)
	if err != nil || len(names) != 4 || names[0].Owner != (store.Owner{}) {
		t.Fatalf("Peek without owners = %+v, %v", names, err)
	}
	none, err := Peek(root, "other", true)
	if err != nil || none != nil {
		t.Fatalf("Peek of an unknown network = %+v, %v", none, err)
	}
	if _, err := os.Stat(filepath.Join(root, "other")); !os.IsNotExist(err) {
		t.Fatalf("Peek created the directory of an unknown network: %v", err)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
