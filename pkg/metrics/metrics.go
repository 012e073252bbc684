// Package metrics holds the Prometheus metrics of the Village agent
// (`villaged run`) and the small HTTP server that exposes them with liveness
// (/healthz) and readiness (/readyz) endpoints.
//
// Everything lives in the Metrics value's own registry, never in the
// client_golang global one, so tests and several agents in one process do
// not collide. The update methods are safe on a nil *Metrics (metrics off),
// so the agent can call them unconditionally:
//
//	m := metrics.New()
//	go m.Serve(ctx, metrics.DefaultAddr, metrics.Probes{Live: alive, Ready: ready})
//	...
//	start := time.Now()
//	rep, err := reconcile(ctx)
//	m.ObserveReconcile(time.Since(start), err)
//	m.SetPeers(len(peers))
//	m.AddDrift(rep.Found, rep.Repaired)
//
// Metric names (all prefixed village_):
//
//	village_peers                              gauge    peers known (registry and static)
//	village_reconcile_runs_total               counter  reconcile passes
//	village_reconcile_errors_total             counter  passes that ended in an error
//	village_reconcile_duration_seconds         histogram
//	village_drift_found_total                  counter  objects found out of their wanted state
//	village_drift_repaired_total               counter  of those, put right
//	village_ipam_allocations{network,pool}     gauge    addresses allocated per pool
//	village_lease_renewals_total               counter  node/subnet lease keep-alives that succeeded
//	village_lease_renewal_errors_total         counter  ... that failed
//	village_netfilter_passes_total             counter  passes over the netfilter rules (masq.Keep)
//	village_netfilter_errors_total             counter  ... that failed
//	village_build_info{version}                gauge    always 1
//
// plus the Go runtime and process collectors (go_*, process_*).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/village-cni/village/pkg/buildinfo"
)

// DefaultAddr is where Serve listens when given no address: loopback only,
// so a node's metrics are not on the network unless asked for.
const DefaultAddr = "127.0.0.1:9696"

const namespace = "village"

// Metrics are the agent's collectors in their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	Peers              prometheus.Gauge
	ReconcileRuns      prometheus.Counter
	ReconcileErrors    prometheus.Counter
	ReconcileDuration  prometheus.Histogram
	DriftFound         prometheus.Counter
	DriftRepaired      prometheus.Counter
	Allocations        *prometheus.GaugeVec // labels: network, pool
	LeaseRenewals      prometheus.Counter
	LeaseRenewalErrors prometheus.Counter
	NetfilterPasses    prometheus.Counter
	NetfilterErrors    prometheus.Counter

	policy *PolicyMetrics // netpol.go
}

// New makes the collectors and registers them (and the Go runtime and
// process collectors) in a new registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Peers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "peers",
			Help: "Peer nodes known to this node (registry and static), excluding itself."}),
		ReconcileRuns: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "reconcile_runs_total",
			Help: "Reconcile passes run (routes, FDB, neighbours, masquerade)."}),
		ReconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "reconcile_errors_total",
			Help: "Reconcile passes that ended in an error."}),
		ReconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "reconcile_duration_seconds",
			Help: "Time a reconcile pass took.", Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30}}),
		DriftFound: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "drift_found_total",
			Help: "Node objects found different from what they should be (missing, extra or wrong)."}),
		DriftRepaired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "drift_repaired_total",
			Help: "Drifted node objects put right."}),
		Allocations: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "ipam", Name: "allocations",
			Help: "Addresses allocated, per network and pool (range subnet)."}, []string{"network", "pool"}),
		LeaseRenewals: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "lease_renewals_total",
			Help: "Successful keep-alives of this node's registry and subnet leases."}),
		LeaseRenewalErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "lease_renewal_errors_total",
			Help: "Failed keep-alives of this node's registry and subnet leases."}),
		NetfilterPasses: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "netfilter_passes_total",
			Help: "Passes that kept the network's netfilter rules (masquerade, forward accept, macspoofchk)."}),
		NetfilterErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "netfilter_errors_total",
			Help: "Netfilter passes that ended in an error."}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "build_info",
		Help: "Always 1; the version label says which villaged runs.", ConstLabels: prometheus.Labels{"version": buildinfo.Version}})
	info.Set(1)
	m.policy = newPolicyMetrics(m.Registry)
	m.Registry.MustRegister(m.Peers, m.ReconcileRuns, m.ReconcileErrors, m.ReconcileDuration, m.DriftFound,
		m.DriftRepaired, m.Allocations, m.LeaseRenewals, m.LeaseRenewalErrors, m.NetfilterPasses, m.NetfilterErrors, info,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveReconcile counts one reconcile pass that took d and ended with err.
func (m *Metrics) ObserveReconcile(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.ReconcileRuns.Inc()
	m.ReconcileDuration.Observe(d.Seconds())
	if err != nil {
		m.ReconcileErrors.Inc()
	}
}

// SetPeers records how many peers the node knows.
func (m *Metrics) SetPeers(n int) {
	if m == nil {
		return
	}
	m.Peers.Set(float64(n))
}

// AddDrift adds the drift one pass found and how much of it it repaired.
func (m *Metrics) AddDrift(found, repaired int) {
	if m == nil {
		return
	}
	if found > 0 {
		m.DriftFound.Add(float64(found))
	}
	if repaired > 0 {
		m.DriftRepaired.Add(float64(repaired))
	}
}

// SetAllocations records the addresses allocated in one pool of a network.
func (m *Metrics) SetAllocations(network, pool string, n int) {
	if m == nil {
		return
	}
	m.Allocations.WithLabelValues(network, pool).Set(float64(n))
}

// ResetAllocations forgets every pool, for an agent that recounts them all
// (a pool that went away then stops being reported).
func (m *Metrics) ResetAllocations() {
	if m == nil {
		return
	}
	m.Allocations.Reset()
}

// NetfilterKept counts one pass over the netfilter rules; err says whether
// it failed. Drift it found goes to AddDrift.
func (m *Metrics) NetfilterKept(err error) {
	if m == nil {
		return
	}
	m.NetfilterPasses.Inc()
	if err != nil {
		m.NetfilterErrors.Inc()
	}
}

// LeaseRenewed counts one lease keep-alive; err says whether it failed.
func (m *Metrics) LeaseRenewed(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.LeaseRenewalErrors.Inc()
		return
	}
	m.LeaseRenewals.Inc()
}
