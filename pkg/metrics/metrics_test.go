package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestCollectorsAndExposition(t *testing.T) {
	m := New()
	m.SetPeers(3)
	m.ObserveReconcile(20*time.Millisecond, nil)
	m.ObserveReconcile(5*time.Millisecond, errors.New("etcd unreachable"))
	m.AddDrift(4, 3)
	m.AddDrift(0, 0)
	m.SetAllocations("village", "10.244.1.0/24", 17)
	m.SetAllocations("village", "fd00:10:244:1::/64", 17)
	m.LeaseRenewed(nil)
	m.LeaseRenewed(nil)
	m.LeaseRenewed(errors.New("lease expired"))

	for _, c := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.Peers, 3}, {m.ReconcileRuns, 2}, {m.ReconcileErrors, 1}, {m.DriftFound, 4}, {m.DriftRepaired, 3},
		{m.Allocations.WithLabelValues("village", "10.244.1.0/24"), 17}, {m.LeaseRenewals, 2}, {m.LeaseRenewalErrors, 1},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("%T = %v, want %v", c.c, got, c.want)
		}
	}

	srv := httptest.NewServer(m.Handler(Probes{}))
	defer srv.Close()
	code, body := get(t, srv.URL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		"village_peers 3",
		"village_reconcile_runs_total 2",
		"village_reconcile_errors_total 1",
		"village_drift_found_total 4",
		"village_drift_repaired_total 3",
		`village_ipam_allocations{network="village",pool="10.244.1.0/24"} 17`,
		"village_lease_renewals_total 2",
		"village_reconcile_duration_seconds_count 2",
		"village_build_info{version=",
		"go_goroutines",
		"process_resident_memory_bytes",
		"# HELP village_peers ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The global registry is untouched.
	if mfs, _ := prometheus.DefaultGatherer.Gather(); hasVillage(mfs) {
		t.Error("village metrics leaked into the global registry")
	}
	// A pool that goes away stops being reported after a reset.
	m.ResetAllocations()
	m.SetAllocations("village", "10.244.1.0/24", 2)
	if n := testutil.CollectAndCount(m.Allocations); n != 1 {
		t.Errorf("allocations series after reset: %d", n)
	}
}

func hasVillage(mfs []*dto.MetricFamily) bool {
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "village_") {
			return true
		}
	}
	return false
}

func TestNilMetricsIsANoOp(t *testing.T) {
	var m *Metrics
	m.SetPeers(1)
	m.ObserveReconcile(time.Second, errors.New("x"))
	m.AddDrift(1, 1)
	m.SetAllocations("n", "p", 1)
	m.ResetAllocations()
	m.LeaseRenewed(nil)
}

func TestTwoInstancesDoNotCollide(t *testing.T) {
	a, b := New(), New()
	a.SetPeers(1)
	b.SetPeers(2)
	if testutil.ToFloat64(a.Peers) != 1 || testutil.ToFloat64(b.Peers) != 2 {
		t.Fatal("instances share state")
	}
}

func TestServeHealthAndShutdown(t *testing.T) {
	m := New()
	var sick, unready atomic.Value
	sick.Store("")
	unready.Store("no pod subnet held yet")
	check := func(v *atomic.Value) func() error {
		return func() error {
			if s := v.Load().(string); s != "" {
				return errors.New(s)
			}
			return nil
		}
	}
	probes := Probes{Live: check(&sick), Ready: check(&unready)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.ServeListener(ctx, ln, probes) }()

	if code, body := get(t, url+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz healthy: %d %q", code, body)
	}
	// Alive but not ready: the two probes answer independently.
	if code, body := get(t, url+"/readyz"); code != 503 || !strings.Contains(body, "no pod subnet held yet") {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	unready.Store("")
	if code, body := get(t, url+"/readyz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/readyz ready: %d %q", code, body)
	}
	sick.Store("etcd https://10.0.0.1:2379: context deadline exceeded")
	if code, body := get(t, url+"/healthz"); code != 503 || !strings.Contains(body, "etcd https://10.0.0.1:2379") {
		t.Errorf("/healthz sick: %d %q", code, body)
	}
	if code, body := get(t, url+"/metrics"); code != 200 || !strings.Contains(body, "village_peers 0") {
		t.Errorf("/metrics: %d", code)
	}
	if code, _ := get(t, url+"/nope"); code != 404 {
		t.Errorf("/nope: %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("still serving after shutdown")
	}
}

func TestServeDefaultAddrAndListenError(t *testing.T) {
	// Occupy a loopback port, then ask Serve for it: the error names it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = New().Serve(context.Background(), ln.Addr().String(), Probes{})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("Serve on a busy port: %v", err)
	}
	if host, _, _ := net.SplitHostPort(DefaultAddr); !net.ParseIP(host).IsLoopback() {
		t.Fatalf("DefaultAddr %s is not loopback", DefaultAddr)
	}
}

func TestPolicyDrops(t *testing.T) {
	m := New()
	n := uint64(3)
	m.PolicyDrops("net", func() ([]PolicyDrop, error) {
		return []PolicyDrop{{Direction: "ingress", Namespace: "ns", Policy: "allow-c,deny-b", Packets: n}}, nil
	})
	m.PolicyDrops("broken", func() ([]PolicyDrop, error) { return nil, errors.New("no nftables") })
	m.PolicyDropSampled("net", "ingress")
	want := `
# HELP village_policy_drops_total Packets NetworkPolicy dropped, by direction, namespace of the dropping pod and the policies isolating it (from the nftables counters).
# TYPE village_policy_drops_total counter
village_policy_drops_total{direction="ingress",namespace="ns",network="net",policy="allow-c,deny-b"} %d
`
	for _, n = range []uint64{3, 25} { // read at each scrape
		if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(fmt.Sprintf(want, n)), "village_policy_drops_total"); err != nil {
			t.Error(err)
		}
	}
	if got := testutil.ToFloat64(m.policy.DropSamples.WithLabelValues("net", "ingress")); got != 1 {
		t.Errorf("samples %v, want 1", got)
	}
	var nilM *Metrics
	nilM.PolicyDrops("net", nil)
	nilM.PolicyDropSampled("net", "ingress")
}
