package plugin_test

import (
	"path/filepath"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/ipam/plugin"
)

// TestHostLocalCompat shares one data directory between the reference
// host-local binary and village-ipam: neither hands out an address the other
// holds, and each releases and checks the other's reservations.
func TestHostLocalCompat(t *testing.T) {
	dir := t.TempDir()
	c := netConf{DataDir: dir, IPAM: `"ranges":[[{"subnet":"10.30.0.0/29"}]]`}
	hl := filepath.Join(testenv.RefBins(t), "host-local")
	add := func(bin, id, want string) {
		t.Helper()
		r := addResult(t, run(t, call{bin: bin, cmd: "ADD", id: id, stdin: c.bytes()}), "1.1.0")
		if got := addrs(r); got != want {
			t.Fatalf("%s ADD %s = %s, want %s", filepath.Base(bin), id, got, want)
		}
	}
	vi := "" // village-ipam
	add(hl, "hl1", "10.30.0.2/29")
	add(hl, "hl2", "10.30.0.3/29")
	add(vi, "v1", "10.30.0.4/29")
	add(hl, "hl3", "10.30.0.5/29") // host-local follows village's round-robin marker
	add(vi, "v2", "10.30.0.6/29")
	cniErr(t, run(t, call{cmd: "ADD", id: "v3", stdin: c.bytes()}), plugin.ErrCodeExhausted, "no free address in range 10.30.0.1-10.30.0.6")
	if out := run(t, call{bin: hl, cmd: "ADD", id: "hl4", stdin: c.bytes()}); out.ExitCode == 0 {
		t.Fatalf("host-local allocated from a full range: %s", out.Stdout)
	}
	// Repeated ADD and CHECK of a host-local allocation through village-ipam.
	add(vi, "hl2", "10.30.0.3/29")
	mustOK(t, run(t, call{cmd: "CHECK", id: "hl2", stdin: c.bytes()}), "village CHECK of host-local's reservation")
	mustOK(t, run(t, call{bin: hl, cmd: "CHECK", id: "v2", stdin: c.bytes()}), "host-local CHECK of village's reservation")
	// Each releases the other's reservation.
	mustOK(t, run(t, call{cmd: "DEL", id: "hl1", stdin: c.bytes()}), "village DEL of host-local's reservation")
	mustOK(t, run(t, call{bin: hl, cmd: "DEL", id: "v1", stdin: c.bytes()}), "host-local DEL of village's reservation")
	if got := reservations(t, filepath.Join(dir, "testnet")); got != "10.30.0.3 10.30.0.5 10.30.0.6" {
		t.Fatalf("after cross DELs: %s", got)
	}
	// The freed addresses are handed out again, never a held one.
	add(vi, "v3", "10.30.0.2/29")
	add(hl, "hl4", "10.30.0.4/29")
	cniErr(t, run(t, call{cmd: "ADD", id: "v4", stdin: c.bytes()}), plugin.ErrCodeExhausted, "no free address")
	cniErr(t, run(t, call{cmd: "CHECK", id: "v1", stdin: c.bytes()}), plugin.ErrCodeNoAllocation, "holds no address")
}
