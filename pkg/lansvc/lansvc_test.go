package lansvc

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/lansvc/announce"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
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

// StatusLines: what `villaged status` says from the status file a
// running feature writes, one that is off writes, and none.
func TestStatusLines(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   *Status  // nil: no file
		want []string // the lines, each a prefix of the line at its index
	}{
		{"not running", nil, []string{"LAN Services ([]): not running"}},
		{"off", &Status{Off: "members: gossip key: open /etc/village/gossip/key: no such file or directory"},
			[]string{"LAN Services ([]): OFF: members: gossip key: open /etc/village/gossip/key: no such file or directory (as of "}},
		{"in the clear", &Status{Answering: []netip.Addr{netip.MustParseAddr("192.168.50.240")}, Live: []string{"a", "b"}, Warnings: []string{GossipInTheClear}},
			[]string{"LAN Services ([]): answering for 1 of 0 addresses; live agents [a b]", "  192.168.50.240", "LAN Services: WARNING: the agents' gossip (port 7947) is neither encrypted nor authenticated"}},
		{"contested", &Status{Answering: []netip.Addr{}, Live: []string{"a"},
			Contested: []announce.Conflict{{Addr: netip.MustParseAddr("192.168.50.241"), MACText: "02:00:00:00:00:99", Conflicts: 3}}},
			[]string{"LAN Services ([]): answering for 0 of 0 addresses", "  192.168.50.241 CONTESTED: in use by MAC 02:00:00:00:00:99, not answered by this node (3 conflicts"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := t.TempDir()
			if tc.st != nil {
				b, err := json.Marshal(tc.st)
				if err != nil {
					t.Fatal(err)
				}
				path := nodelocal.LANServicesStatus(run, "village")
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got := StatusLines(&netconf.Services{}, run, "village")
			if len(got) != len(tc.want) {
				t.Fatalf("lines %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("line %d %q, want it to start with %q", i, got[i], w)
				}
			}
		})
	}
}

// ownAddrInRanges: a Service range that could hand out the node's own LAN
// address is refused, naming it; one beside it is not.
func TestOwnAddrInRanges(t *testing.T) {
	lan, err := netconf.ParseLAN(json.RawMessage(`{"master":"eth0","services":{"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.240","rangeEnd":"192.168.50.250"}],[{"subnet":"fd00:50::/64","rangeStart":"fd00:50::10","rangeEnd":"fd00:50::20"}]]},` +
		`"ipam":{"type":"village-ipam","store":{"type":"kubernetes"},"ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.100","rangeEnd":"192.168.50.199"}],[{"subnet":"fd00:50::/64"}]]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, own, wantErr string
	}{
		{"beside the range", "192.168.50.11", ""},
		{"inside the IPv4 range", "192.168.50.245", "holds this node's own address 192.168.50.245"},
		{"inside the IPv6 range", "fd00:50::15", "holds this node's own address fd00:50::15"},
		{"the range's last address", "192.168.50.250", "holds this node's own address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ownAddrInRanges("eth0", []netip.Addr{netip.MustParseAddr("fd00:50::1"), netip.MustParseAddr(tc.own)}, lan.Services)
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ownAddrInRanges = %v; want an error with %q", err, tc.wantErr)
			}
		})
	}
}
