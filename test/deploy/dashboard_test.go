package deploy

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/metrics"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	metricName  = regexp.MustCompile(`\bvillage_[a-z0-9_]+`)
	variableRef = regexp.MustCompile(`\$([a-z_]+)`)
)

// TestGrafanaDashboard: deploy/grafana/village.json is a dashboard whose
// panels have distinct ids and queries, and every metric a query names is
// one the agent exposes (pkg/metrics with each collector fed, gathered as
// Prometheus would scrape it), and every variable a query uses is
// defined: a renamed metric fails here, not as an empty panel.
func TestGrafanaDashboard(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "village.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/village.json: %v", err)
	}
	exposed := exposedMetrics(t)
	vars := map[string]bool{"__rate_interval": true, "__all": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	ids := map[int]bool{}
	if d.UID == "" || len(d.Panels) < 5 {
		t.Fatalf("dashboard uid %q with %d panels", d.UID, len(d.Panels))
	}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			names := metricName.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q query %s names no village metric: %s", p.Title, q.RefID, q.Expr)
			}
			for _, n := range names {
				if !exposed[n] {
					t.Errorf("panel %q names %s, which the agent does not expose (it has %v)", p.Title, n, slices.Sorted(maps.Keys(exposed)))
				}
			}
			for _, m := range variableRef.FindAllStringSubmatch(q.Expr, -1) {
				if !vars[m[1]] {
					t.Errorf("panel %q uses $%s, which the dashboard does not define", p.Title, m[1])
				}
			}
		}
	}
}

// exposedMetrics are the village_* metric names the agent's registry
// gathers once every collector has something to say.
func exposedMetrics(t *testing.T) map[string]bool {
	m := metrics.New()
	m.WatchPods(func() ([]metrics.PodTraffic, error) {
		return []metrics.PodTraffic{{Namespace: "ns", Pod: "p", RxBytes: 1, TxBytes: 1, RxPackets: 1, TxPackets: 1}}, nil
	})
	m.PolicyDrops("net", func() ([]metrics.PolicyDrop, error) {
		return []metrics.PolicyDrop{{Direction: "ingress", Namespace: "ns", Policy: "deny", Packets: 1}}, nil
	})
	m.PolicyDropSampled("net", "ingress")
	m.ObservePolicy("net", time.Millisecond, nil, 1, 0)
	m.ObservePolicy("net", time.Millisecond, errors.New("a failed transaction"), 1, 0)
	m.ObserveReconcile(time.Millisecond, errors.New("a failed pass"))
	m.AddDrift(1, 1)
	m.SetAllocations("net", "10.0.0.0/24", 1)
	m.LeaseRenewed(errors.New("a lost lease"))
	m.NetfilterKept(errors.New("a failed pass"))
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "village_") {
			out[mf.GetName()] = true
		}
	}
	return out
}
