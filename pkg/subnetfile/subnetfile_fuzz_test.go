package subnetfile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/subnetfile"
)

// FuzzRead fuzzes the file villaged publishes (and an operator may
// edit by hand): no panic, and only valid prefixes come out.
func FuzzRead(f *testing.F) {
	for _, s := range []string{"10.244.1.0/24\n", "# leased\n10.244.1.0/24\nfd44:0:0:1::/64\n", "", "\n\n", "garbage", "10.244.1.5/24", "fe80::/64%eth0", "\x00\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "subnet")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		ps, err := subnetfile.Read(path)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %v does not name the file", err)
			}
			return
		}
		if len(ps) == 0 {
			t.Fatal("no prefix and no error")
		}
		for _, p := range ps {
			if !p.IsValid() || p.Addr().Zone() != "" {
				t.Fatalf("accepted prefix %v", p)
			}
		}
	})
}
