package main

import (
	"bytes"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/drops"
	"github.com/village-cni/village/pkg/netpol/table"
)

func TestDropsReport(t *testing.T) {
	now := time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC)
	ip := netip.MustParseAddr
	m := &netpol.Model{Network: "n", Pods: []netpol.ModelPod{
		{Pod: "web/server", IPs: []netip.Addr{ip("10.1.0.2")}, Local: true, Ingress: &netpol.Isolation{Policies: []string{"web/deny-all"}}},
		{Pod: "web/client", IPs: []netip.Addr{ip("10.1.0.3")}, Local: true},
		{Pod: "db/pg", IPs: []netip.Addr{ip("10.1.0.4")}, Local: true, Egress: &netpol.Isolation{Policies: []string{"db/a", "db/b"}}},
	}}
	names := drops.NamesOf(m)
	hashed := table.ChainName("egress", "db/pg")
	cds := []table.ChainDrops{
		{Chain: "in.web/server", Direction: "ingress", Key: "web/server", Counts: table.Counts{Packets: 25, Bytes: 1000}},
		{Chain: hashed, Direction: "egress", Counts: table.Counts{Packets: 3, Bytes: 120}},
	}
	file := &drops.File{Network: "n", Time: now, Samples: 30, Drops: []drops.Drop{
		{Direction: "ingress", Source: drops.Endpoint{Pod: "web/client", Address: ip("10.1.0.3")}, Destination: drops.Endpoint{Pod: "web/server", Address: ip("10.1.0.2")},
			Proto: "udp", Port: 9, Policies: []string{"web/deny-all"}, Count: 20, First: now.Add(-time.Minute), Last: now.Add(-10 * time.Second)},
		{Direction: "egress", Source: drops.Endpoint{Pod: "db/pg", Address: ip("10.1.0.4")}, Destination: drops.Endpoint{Address: ip("192.0.2.9")},
			Proto: "icmp", Policies: []string{"db/a", "db/b"}, Count: 3, First: now.Add(-time.Hour), Last: now.Add(-time.Hour)},
	}}
	for _, tc := range []struct {
		name   string
		f      dropsFilter
		cerr   error
		counts []string // pod direction packets
		drops  []string // dropLine
	}{
		{"all", dropsFilter{}, nil, []string{"db/pg egress 3", "web/server ingress 25"}, []string{
			"20:59:50     20  ingress  web/client → web/server udp/9  policies web/deny-all",
			"20:00:00      3  egress   db/pg → 192.0.2.9 icmp  policies db/a,db/b"}},
		{"since", dropsFilter{since: 5 * time.Minute}, nil, []string{"db/pg egress 3", "web/server ingress 25"}, []string{
			"20:59:50     20  ingress  web/client → web/server udp/9  policies web/deny-all"}},
		{"namespace", dropsFilter{namespace: "db"}, nil, []string{"db/pg egress 3"}, []string{
			"20:00:00      3  egress   db/pg → 192.0.2.9 icmp  policies db/a,db/b"}},
		{"pod, source or destination", dropsFilter{pod: "client"}, nil, nil, []string{
			"20:59:50     20  ingress  web/client → web/server udp/9  policies web/deny-all"}},
		{"namespace and pod", dropsFilter{namespace: "db", pod: "server"}, nil, nil, nil},
		{"no counts", dropsFilter{}, errors.New("run as root on the node"), nil, []string{
			"20:59:50     20  ingress  web/client → web/server udp/9  policies web/deny-all",
			"20:00:00      3  egress   db/pg → 192.0.2.9 icmp  policies db/a,db/b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := cds
			if tc.cerr != nil {
				in = nil
			}
			r := report("n", in, tc.cerr, names, file, tc.f, now)
			var counts, lines []string
			for _, c := range r.Counts {
				counts = append(counts, strings.Join([]string{c.Pod, c.Direction, strconv.FormatUint(c.Packets, 10)}, " "))
			}
			for _, d := range r.Drops {
				lines = append(lines, dropLine(d))
			}
			if strings.Join(counts, "\n") != strings.Join(tc.counts, "\n") {
				t.Errorf("counts:\n%s\nwant:\n%s", strings.Join(counts, "\n"), strings.Join(tc.counts, "\n"))
			}
			if strings.Join(lines, "\n") != strings.Join(tc.drops, "\n") {
				t.Errorf("drops:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(tc.drops, "\n"))
			}
			var out bytes.Buffer
			r.print(&out)
			if tc.cerr != nil && !strings.Contains(out.String(), "exact counts: not read (run as root on the node)") {
				t.Errorf("printed:\n%s", out.String())
			}
			if tc.cerr == nil && len(tc.counts) > 0 && !strings.Contains(out.String(), "exact counts (nftables):") {
				t.Errorf("printed:\n%s", out.String())
			}
		})
	}
	var out bytes.Buffer
	report("n", nil, nil, names, nil, dropsFilter{}, now).print(&out)
	if want := "exact counts: no isolated pod on this node\nlatest drops: none sampled yet"; !strings.HasPrefix(out.String(), want) {
		t.Errorf("no file, no chain: %q", out.String())
	}
}
