package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/drops"
)

// dropsJSON is n's `villaged drops --json` (cmd/villaged DropsReport).
type dropsJSON struct {
	Counts []struct {
		Pod, Direction string
		Policies       []string
		Packets        uint64
	} `json:"counts"`
	CountsError string       `json:"countsError"`
	Drops       []drops.Drop `json:"drops"`
}

func (l *npLab) askDrops(n *agentNode, args ...string) (dropsJSON, string) {
	out, err := n.villaged(l.t, append([]string{"drops", "--conf", l.conf, "--node-name", n.name, "--run-dir", n.runDir}, args...)...).CombinedOutput()
	must(l.t, err, "villaged drops: %s", out)
	var r dropsJSON
	if slices.Contains(args, "--json") {
		must(l.t, json.Unmarshal(out, &r), "villaged drops --json: %s", out)
	}
	return r, string(out)
}

// ingressCount is the exact count of pod's ingress chain in r (-1: none).
func (r dropsJSON) ingressCount(pod string) int64 {
	for _, c := range r.Counts {
		if c.Pod == pod && c.Direction == "ingress" {
			return int64(c.Packets)
		}
	}
	return -1
}

// drops runs on TestNetworkPolicyAgents' lab, where server (on n) is
// isolated for ingress by deny-web (deny all) and opened to allowed's
// label on port 8080 by far-to-web, and denied (on n too, bridged) is
// admitted by nothing. denied sends exactly 25 UDP datagrams to a closed
// port of server (dropped in forward, so nothing answers) while allowed
// connects: n's `villaged drops` counts exactly 25 more drops of server's
// ingress chain, and so does village_policy_drops_total; the named sample
// says denied → server udp/port, ingress, with deny-web among the
// policies; allowed's connection appears nowhere.
func (l *npLab) drops(n *agentNode, server, denied, allowed *npPod) {
	t := l.t
	const sent, port = 25, 9999
	key, from := "np/"+server.name, "np/"+denied.name
	r0, _ := l.askDrops(n, "--json")
	before := r0.ingressCount(key)
	if before < 0 {
		t.Fatalf("villaged drops has no count for %s's ingress chain: %+v", key, r0)
	}
	series := `village_policy_drops_total{direction="ingress",namespace="np",network="agt",policy="deny-web,far-to-web"}`
	scrape := func() (float64, string) {
		body, code := httpGetIn(t, n.NS, "http://127.0.0.1:9696/metrics")
		if code != http.StatusOK {
			return -1, body
		}
		return metricValue(body, series), body
	}
	m0, body := scrape()
	if m0 < 0 {
		t.Fatalf("no %s on /metrics:\n%s", series, body)
	}

	must(t, testenv.SendUDP(denied.pod.NS, server.ip, port, sent), "sending %d datagrams from %s to %s", sent, denied.name, server.name)
	l.reach(allowed, server, 8080, true)
	var r dropsJSON
	waitFor(t, 60*time.Second, fmt.Sprintf("%s's villaged drops to count %d drops of %s", n.name, before+sent, key), func() (bool, string) {
		var out string
		r, out = l.askDrops(n, "--json")
		if c := r.ingressCount(key); c > before+sent {
			t.Fatalf("%s's ingress chain counts %d drops, %d before and %d sent:\n%s", key, c, before, sent, out)
		}
		return r.ingressCount(key) == before+sent, out
	})
	if m, body := scrape(); m-m0 != sent {
		t.Errorf("%s grew by %v, want %d:\n%s", series, m-m0, sent, body)
	}
	var sample *drops.Drop
	waitFor(t, 60*time.Second, fmt.Sprintf("a named sample of %s → %s udp/%d", from, key, port), func() (bool, string) {
		r, _ = l.askDrops(n, "--json")
		for i, d := range r.Drops {
			if d.Source.Pod == from && d.Destination.Pod == key && d.Proto == "udp" && d.Port == port {
				sample = &r.Drops[i]
			}
		}
		return sample != nil, fmt.Sprintf("%+v", r.Drops)
	})
	if sample.Direction != "ingress" || !slices.Contains(sample.Policies, "np/deny-web") || sample.Count == 0 || sample.Count > sent {
		t.Errorf("the sample of %s → %s: %+v", from, key, *sample)
	}
	for _, d := range r.Drops {
		if d.Source.Pod == "np/"+allowed.name && d.Port == 8080 {
			t.Errorf("the allowed connection %s → %s:8080 is among the drops: %+v", allowed.name, server.name, d)
		}
	}
	_, text := l.askDrops(n, "--pod", server.name, "--since", "1m")
	t.Logf("villaged drops --pod %s --since 1m:\n%s", server.name, text)
	_, body = scrape()
	var lines []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "village_policy_drop") {
			lines = append(lines, line)
		}
	}
	t.Logf("%s's policy drop metrics:\n%s", n.name, strings.Join(lines, "\n"))
}
