package e2e

import (
	"strings"
	"testing"
)

// BenchmarkLANPodAdd is one ADD+DEL of a pod of a "pods": "annotated"
// network without the LAN interface and with one from the disk-store pool
// (CNI_ARGS VILLAGE_LAN=true), through libcni and the built binaries: what
// a LAN interface adds to a pod's start (the second IPAM exec, the macvlan,
// the announcement). Figures: docs/performance.md.
func BenchmarkLANPodAdd(b *testing.B) {
	lan := NewLAN(b)
	n := NewNode(b)
	lan.Attach(b, n.NS, "lan0", "192.168.77.10/24")
	l := ConfList(b, strings.Replace(lanList(n, "lanbench", "10.53.1.0/24", "192.168.77.200", "192.168.77.250", ""),
		`"hostShim":true,`, `"hostShim":true,"pods":"annotated",`, 1))
	for _, bc := range []struct {
		name string
		args [][2]string
	}{
		{"NoLAN", nil},
		{"LANPool", [][2]string{{"VILLAGE_LAN", "true"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				p := n.NewPod()
				b.StartTimer()
				if _, err := addArgs(n, l, p, bc.args...); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := n.Del(l, p); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
