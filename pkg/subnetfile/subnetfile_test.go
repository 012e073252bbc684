package subnetfile_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/subnetfile"
)

func TestWriteThenRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ovl", "subnet")
	_, v4, _ := net.ParseCIDR("10.60.3.0/24")
	_, v6, _ := net.ParseCIDR("fd60:0:0:3::/64")
	changed, err := subnetfile.Write(path, "leased by a test", []*net.IPNet{v4, v6})
	if err != nil || !changed {
		t.Fatalf("first Write: changed %v, %v", changed, err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "# leased by a test\n10.60.3.0/24\nfd60:0:0:3::/64\n" {
		t.Fatalf("file holds %q (%v)", b, err)
	}
	if changed, err := subnetfile.Write(path, "leased by a test", []*net.IPNet{v4, v6}); err != nil || changed {
		t.Fatalf("same content again: changed %v, %v", changed, err)
	}
	ps, err := subnetfile.Read(path)
	if err != nil || len(ps) != 2 || ps[0].String() != "10.60.3.0/24" || ps[1].String() != "fd60:0:0:3::/64" {
		t.Fatalf("Read = %v, %v", ps, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".subnet"+nodelocal.TempInfix+"*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
