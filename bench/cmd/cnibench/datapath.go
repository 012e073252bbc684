package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// dpPath is one path of the datapath section.
type dpPath struct {
	key, what string
	p         tputPath
}

// datapath: pod to pod across two nodes joined by a veth "LAN", for
// Village's host-gw, vxlan and auto (both peers on the LAN), against the
// same traffic between the two node namespaces themselves (the underlay)
// and against the same topology made by hand with ip (a bridge and veths
// with a route via the peer; a VXLAN device pair with the same MTU and
// permanent neighbour and FDB entries). ipMasq is off (pod-to-pod traffic
// is never masqueraded) except in one host-gw row with it on, as the
// DaemonSet ships it. Per round every path is measured once, the order
// rotating: TCP throughput (iperf3, one stream) and the request/response
// rate (tcprr: one connection, 1-byte request and answer, blocking
// sockets, as netperf's TCP_RR). The pod MTU is read from the client
// pod's eth0.
func datapath(l *lab, o options, v *suite, s samples, t *table) error {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return fmt.Errorf("datapath needs iperf3 (apt-get install -y iperf3)")
	}
	if o.tcprr == "" {
		return fmt.Errorf("datapath needs -tcprr (go build ./bench/cmd/tcprr)")
	}
	var paths []dpPath
	add := func(key, what string, p tputPath, err error) error {
		if err != nil {
			return fmt.Errorf("%s path: %w", what, err)
		}
		paths = append(paths, dpPath{key, what, p})
		return nil
	}
	vhg, err := villagePath(l, v, "host-gw", 3, false)
	if err := add("vhostgw", "Village host-gw", vhg, err); err != nil {
		return err
	}
	// The underlay: the host-gw pair's node namespaces, node to node.
	if err := add("underlay", "underlay (node to node over the LAN)", tputPath{client: vhg.nodes[0], server: vhg.nodes[1], serverIP: vhg.lanIPs[1],
		nodes: vhg.nodes, lanIPs: vhg.lanIPs}, nil); err != nil {
		return err
	}
	p, err := villagePath(l, v, "vxlan", 4, false)
	if err := add("vvxlan", "Village vxlan", p, err); err != nil {
		return err
	}
	p, err = villagePath(l, v, "auto", 5, false)
	if err := add("vauto", "Village auto (peers on the LAN)", p, err); err != nil {
		return err
	}
	p, err = villagePath(l, v, "host-gw", 6, true)
	if err := add("vhostgwmasq", "Village host-gw, ipMasq on", p, err); err != nil {
		return err
	}
	p, err = handPath(l, "host-gw", 3)
	if err := add("hhostgw", "hand-built bridge + veth + route", p, err); err != nil {
		return err
	}
	p, err = handPath(l, "vxlan", 4)
	if err := add("hvxlan", "hand-built VXLAN pair", p, err); err != nil {
		return err
	}
	mtu := map[string]float64{}
	for _, x := range paths {
		m, err := linkMTU(x.p.client, "eth0")
		if x.key == "underlay" {
			m, err = linkMTU(x.p.client, "lan0")
		}
		if err != nil {
			return err
		}
		mtu[x.key] = float64(m)
	}
	logf("datapath: %d paths, iperf3 %d s and tcprr %d s each, %d rounds", len(paths), o.iperfSecs, o.iperfSecs, o.iperfRounds)
	for round := 0; round < o.iperfRounds; round++ {
		for i := range paths {
			x := paths[(i+round)%len(paths)]
			bps, err := iperf(x.p, o.iperfSecs)
			if err != nil {
				return fmt.Errorf("%s: %w", x.what, err)
			}
			s.add("dp.tput."+x.key, bps/1e9)
		}
		for i := range paths {
			x := paths[(i+round)%len(paths)]
			rr, err := tcpRR(o.tcprr, x.p, o.iperfSecs)
			if err != nil {
				return fmt.Errorf("%s: %w", x.what, err)
			}
			s.add("dp.rr."+x.key, rr.PerSecond)
			s.add("dp.rrp99."+x.key, rr.P99us)
		}
	}
	cmp := func(metric string, a, b float64, unit, target string, min float64) {
		rw := row2(metric, a, b, unit)
		if target != "" {
			rw.target, rw.met = target, yes(a/b >= min)
		}
		t.add(rw)
	}
	for _, m := range []struct{ name, key, unit, tool string }{
		{"TCP", "tput", "Gbit/s", fmt.Sprintf("iperf3 %d s, one stream", o.iperfSecs)},
		{"TCP_RR", "rr", "tr/s", fmt.Sprintf("tcprr %d s, 1-byte", o.iperfSecs)},
	} {
		f := func(k string) float64 { return s.med("dp." + m.key + "." + k) }
		t.add(row{metric: fmt.Sprintf("%s node→node over the LAN, the underlay (%s)", m.name, m.tool), village: f("underlay"), reference: math.NaN(), unit: m.unit, ratio: math.NaN()})
		cmp(m.name+" pod→pod, Village host-gw vs the underlay", f("vhostgw"), f("underlay"), m.unit, "≥ 0.97×", 0.97)
		cmp(m.name+" pod→pod, Village host-gw vs hand-built bridge + veth + route", f("vhostgw"), f("hhostgw"), m.unit, "", 0)
		cmp(m.name+" pod→pod, hand-built bridge + veth + route vs the underlay", f("hhostgw"), f("underlay"), m.unit, "", 0)
		cmp(m.name+" pod→pod, Village host-gw with ipMasq on vs the underlay", f("vhostgwmasq"), f("underlay"), m.unit, "", 0)
		cmp(m.name+" pod→pod, Village vxlan vs hand-built VXLAN pair", f("vvxlan"), f("hvxlan"), m.unit, "≥ 0.97×", 0.97)
		cmp(m.name+" pod→pod, Village auto (peers on the LAN) vs Village host-gw", f("vauto"), f("vhostgw"), m.unit, "= host-gw (≥ 0.97×)", 0.97)
	}
	for _, x := range paths {
		t.add(row{metric: "TCP_RR p99 of one transaction, " + x.what, village: s.med("dp.rrp99." + x.key), reference: math.NaN(), unit: "µs", ratio: math.NaN()})
	}
	for _, x := range paths {
		what := "pod MTU (eth0), " + x.what
		if x.key == "underlay" {
			what = "underlay MTU (lan0)"
		}
		t.add(row{metric: what, village: mtu[x.key], reference: math.NaN(), unit: "B", ratio: math.NaN()})
	}
	return nil
}

func linkMTU(netns, dev string) (int, error) {
	out, err := run(context.Background(), 5*time.Second, "ip", "-n", netns, "-o", "link", "show", "dev", dev)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(out)
	for i, w := range f {
		if w == "mtu" && i+1 < len(f) {
			return strconv.Atoi(f[i+1])
		}
	}
	return 0, fmt.Errorf("no mtu for %s in %s: %s", dev, netns, out)
}

// rrResult is tcprr's output line.
type rrResult struct {
	PerSecond float64 `json:"per_second"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
}

// tcpRR runs one bounded tcprr measurement from p.client to p.server.
func tcpRR(bin string, p tputPath, secs int) (rrResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+20)*time.Second)
	defer cancel()
	addr := p.serverIP + ":5300"
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", p.server, bin, "-listen", addr)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return rrResult{}, err
	}
	if err := srv.Start(); err != nil {
		return rrResult{}, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return rrResult{}, fmt.Errorf("tcprr server in %s: %q, %v", p.server, line, err)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", p.client, bin, "-connect", addr, "-t", fmt.Sprintf("%ds", secs)).CombinedOutput()
	if err != nil {
		return rrResult{}, fmt.Errorf("tcprr %s -> %s: %v: %s", p.client, addr, err, out)
	}
	var r rrResult
	if err := json.Unmarshal(out, &r); err != nil {
		return rrResult{}, fmt.Errorf("tcprr output: %v: %s", err, out)
	}
	return r, nil
}
