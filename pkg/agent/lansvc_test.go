package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// IPVSWarning: only kube-ipvs0 present with arp_ignore other than 1 (or
// unreadable) warns.
func TestIPVSWarning(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ipvs      bool
		arpIgnore string // "" : no file
		warn      bool
	}{
		{"no IPVS", false, "0", false},
		{"IPVS with strictARP", true, "1", false},
		{"IPVS with strictARP, newline", true, "1\n", false},
		{"IPVS without strictARP", true, "0\n", true},
		{"IPVS, arp_ignore 2", true, "2", true},
		{"IPVS, arp_ignore unreadable", true, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys, proc := t.TempDir(), t.TempDir()
			if tc.ipvs {
				if err := os.MkdirAll(filepath.Join(sys, "class/net/kube-ipvs0"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.arpIgnore != "" {
				dir := filepath.Join(proc, "sys/net/ipv4/conf/all")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "arp_ignore"), []byte(tc.arpIgnore), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := IPVSWarning(sys, proc); (got != "") != tc.warn {
				t.Fatalf("IPVSWarning = %q; want a warning: %v", got, tc.warn)
			}
		})
	}
}
