package metrics

import (
	"sync"
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
//	village_policy_drops_total{network,direction,namespace,policy}  counter  packets the per-pod chains dropped
//	village_policy_drop_samples_total{network,direction}            counter  of those, the samples the agent named
//
// village_policy_drops_total is read from the chains' exact counters at
// each scrape (PolicyDrops); namespace is the dropping pod's (the
// destination's for ingress, the source's for egress) and policy the
// names of the policies that isolate it in that direction, sorted and
// joined with "," (a pod two policies isolate counts under "a,b"; "" when
// the controller's last compile did not know the pod).
type PolicyMetrics struct {
	Compiles        *prometheus.CounterVec
	CompileErrors   *prometheus.CounterVec
	CompileDuration *prometheus.HistogramVec
	Pods            *prometheus.GaugeVec
	Problems        *prometheus.GaugeVec
	DropSamples     *prometheus.CounterVec
	drops           *dropsCollector
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
		DropSamples: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: "policy", Name: "drop_samples_total",
			Help: "Packets NetworkPolicy dropped that the agent received as samples (NFLOG, 20 a second per pod and direction at most) and named."}, []string{"network", "direction"}),
		drops: &dropsCollector{sources: map[string]func() ([]PolicyDrop, error){}, desc: prometheus.NewDesc(namespace+"_policy_drops_total",
			"Packets NetworkPolicy dropped, by direction, namespace of the dropping pod and the policies isolating it (from the nftables counters).",
			[]string{"network", "direction", "namespace", "policy"}, nil)},
	}
	r.MustRegister(p.Compiles, p.CompileErrors, p.CompileDuration, p.Pods, p.Problems, p.DropSamples, p.drops)
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

// PolicyDrop is one series of village_policy_drops_total.
type PolicyDrop struct {
	Direction, Namespace, Policy string
	Packets                      uint64
}

// PolicyDrops makes read the source of network's
// village_policy_drops_total, called at each scrape (a read that fails
// gives no series).
func (m *Metrics) PolicyDrops(network string, read func() ([]PolicyDrop, error)) {
	if m == nil {
		return
	}
	d := m.policy.drops
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sources[network] = read
}

// PolicyDropSampled counts one sample of network's drops.
func (m *Metrics) PolicyDropSampled(network, direction string) {
	if m == nil {
		return
	}
	m.policy.DropSamples.WithLabelValues(network, direction).Inc()
}

// dropsCollector reads village_policy_drops_total from its sources.
type dropsCollector struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	sources map[string]func() ([]PolicyDrop, error)
}

func (d *dropsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *dropsCollector) Collect(ch chan<- prometheus.Metric) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for network, read := range d.sources {
		drops, err := read()
		if err != nil {
			continue
		}
		for _, pd := range drops {
			ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, float64(pd.Packets), network, pd.Direction, pd.Namespace, pd.Policy)
		}
	}
}
