package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PolicyMetrics are the NetworkPolicy controller's collectors:
//
//	village_netpol_compiles_total{network}              counter  compile+apply runs
//	village_netpol_compile_errors_total{network}        counter  runs whose apply failed
//	village_netpol_compile_duration_seconds{network}    histogram  compile and apply, one run
//	village_netpol_pods{network}                        gauge    local pods isolated by a policy
//	village_netpol_problems{network}                    gauge    policy parts not enforced
type PolicyMetrics struct {
	Compiles        *prometheus.CounterVec
	CompileErrors   *prometheus.CounterVec
	CompileDuration *prometheus.HistogramVec
	Pods            *prometheus.GaugeVec
	Problems        *prometheus.GaugeVec
}

func newPolicyMetrics(r *prometheus.Registry) *PolicyMetrics {
	l := []string{"network"}
	p := &PolicyMetrics{
		Compiles: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: "netpol", Name: "compiles_total",
			Help: "NetworkPolicy compile and apply runs."}, l),
		CompileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: "netpol", Name: "compile_errors_total",
			Help: "NetworkPolicy runs whose nftables transaction failed."}, l),
		CompileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Subsystem: "netpol", Name: "compile_duration_seconds",
			Help: "Time from the start of a compile to its rules in the kernel.", Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5}}, l),
		Pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "netpol", Name: "pods",
			Help: "This node's pods isolated by at least one NetworkPolicy."}, l),
		Problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "netpol", Name: "problems",
			Help: "Parts of NetworkPolicies Village does not enforce (each also an Event)."}, l),
	}
	r.MustRegister(p.Compiles, p.CompileErrors, p.CompileDuration, p.Pods, p.Problems)
	return p
}

// ObservePolicy records one compile-and-apply run of network.
func (m *Metrics) ObservePolicy(network string, d time.Duration, err error, pods, problems int) {
	if m == nil {
		return
	}
	p := m.policy
	p.Compiles.WithLabelValues(network).Inc()
	p.CompileDuration.WithLabelValues(network).Observe(d.Seconds())
	if err != nil {
		p.CompileErrors.WithLabelValues(network).Inc()
	}
	p.Pods.WithLabelValues(network).Set(float64(pods))
	p.Problems.WithLabelValues(network).Set(float64(problems))
}
