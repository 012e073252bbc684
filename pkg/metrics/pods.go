package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PodTraffic is one pod's traffic as its host-side veth counts it, seen
// from the pod: what the pod received is what the veth transmitted.
type PodTraffic struct {
	Namespace, Pod       string
	RxBytes, TxBytes     uint64
	RxPackets, TxPackets uint64
}

// PodReader reads every named pod's traffic on this node, at scrape time.
type PodReader func() ([]PodTraffic, error)

// podCollector turns a PodReader into the village_pod_* counters: read
// from the kernel's own link counters at each scrape, so there is no
// per-packet work and nothing to keep between scrapes.
type podCollector struct {
	mu   sync.Mutex
	read PodReader
	errs prometheus.Counter
}

var (
	podLabels  = []string{"namespace", "pod"}
	podRxBytes = prometheus.NewDesc(prometheus.BuildFQName(namespace, "pod", "receive_bytes_total"),
		"Bytes the pod received on its eth0 (its host veth's transmit counter).", podLabels, nil)
	podTxBytes = prometheus.NewDesc(prometheus.BuildFQName(namespace, "pod", "transmit_bytes_total"),
		"Bytes the pod sent from its eth0 (its host veth's receive counter).", podLabels, nil)
	podRxPackets = prometheus.NewDesc(prometheus.BuildFQName(namespace, "pod", "receive_packets_total"),
		"Packets the pod received on its eth0.", podLabels, nil)
	podTxPackets = prometheus.NewDesc(prometheus.BuildFQName(namespace, "pod", "transmit_packets_total"),
		"Packets the pod sent from its eth0.", podLabels, nil)
)

// WatchPods registers the per-pod traffic counters, read through read at
// each scrape. Pods read cannot name (no pod object holds the address, or
// two do) are left out rather than guessed. Call it once.
func (m *Metrics) WatchPods(read PodReader) {
	c := &podCollector{read: read, errs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: "pod",
		Name: "traffic_read_errors_total", Help: "Scrapes whose per-pod traffic could not be read."})}
	m.Registry.MustRegister(c, c.errs)
}

func (c *podCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{podRxBytes, podTxBytes, podRxPackets, podTxPackets} {
		ch <- d
	}
}

func (c *podCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pods, err := c.read()
	if err != nil {
		c.errs.Inc()
	}
	for _, p := range pods {
		for _, v := range []struct {
			d *prometheus.Desc
			n uint64
		}{{podRxBytes, p.RxBytes}, {podTxBytes, p.TxBytes}, {podRxPackets, p.RxPackets}, {podTxPackets, p.TxPackets}} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), p.Namespace, p.Pod)
		}
	}
}
