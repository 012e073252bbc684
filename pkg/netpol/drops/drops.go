// Package drops names what NetworkPolicy dropped on this node.
//
// Every per-pod chain of a policy table (pkg/netpol/table) ends in a
// counted drop, and before it sends a sample of what it drops (20 packets
// a second per chain at most) to NFLOG group table.LogGroup, its prefix
// saying the direction and network. Run listens on that group in the
// node's network namespace, copying only the first bytes of each packet
// (the headers), and names each sample: source and destination pod (from
// the addresses of the controller's last compile, netpol.Model), protocol
// and destination port, direction, and the policies that isolate the pod
// whose chain dropped it. Samples of one (source, destination, protocol,
// port, direction) add up in one Drop with a count and the times of the
// first and the last; the most recently seen Max of them are kept, and
// written at most every 250 ms, when they changed, to
//
//	<run dir>/<network>/policy-drops.json   (File, `villaged drops`)
//
// A Drop's count is of samples, not of packets: past the rate the chain
// drops more than it samples. The exact count is the chain's counter
// (table.Drops), which Totals turns into village_policy_drops_total.
//
// The NFLOG group is one for the node: the first agent to listen gets the
// samples of every network and keeps those of its own; another network's
// agent on the same node gets none (its counters are still exact).
package drops

import (
	"container/list"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// DefaultMax is how many Drops a Recorder keeps by default.
const DefaultMax = 1024

// WriteEvery is the shortest time between two writes of the drops file.
const WriteEvery = 250 * time.Millisecond

// Endpoint is one end of a dropped packet: a pod of the cluster, or an
// address no pod had at the last compile.
type Endpoint struct {
	// Pod is namespace/name; "" when no pod had Address.
	Pod     string     `json:"pod,omitempty"`
	Address netip.Addr `json:"address"`
}

func (e Endpoint) String() string {
	if e.Pod != "" {
		return e.Pod
	}
	return e.Address.String()
}

// Drop is the samples of one (source, destination, protocol, port,
// direction).
type Drop struct {
	// Direction is "ingress" (the destination's chain dropped it) or
	// "egress" (the source's).
	Direction   string   `json:"direction"`
	Source      Endpoint `json:"source"`
	Destination Endpoint `json:"destination"`
	// Proto is "tcp", "udp", "sctp", "icmp", …; Port the destination
	// port (0 for a protocol without ports).
	Proto string `json:"proto"`
	Port  uint16 `json:"port,omitempty"`
	// Policies are namespace/name of the policies that isolated the
	// dropping pod in Direction when the latest sample came (none: the
	// compile then did not know the pod).
	Policies []string `json:"policies,omitempty"`
	// Count is how many samples; First and Last when the first and the
	// latest came.
	Count uint64    `json:"count"`
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// File is the drops file.
type File struct {
	Network string    `json:"network"`
	Time    time.Time `json:"time"`
	// Samples counts every sample of the network the agent received
	// since it started, Drops those kept (the latest first).
	Samples uint64 `json:"samples"`
	Drops   []Drop `json:"drops"`
}

// Path is network's drops file.
func Path(runDir, network string) string { return nodelocal.PolicyDrops(runDir, network) }

// Read reads network's drops file (nil, nil when missing).
func Read(runDir, network string) (*File, error) {
	var f File
	if found, err := nodelocal.ReadJSON(Path(runDir, network), &f); !found {
		return nil, err
	}
	return &f, nil
}

// Names names addresses and says which policies isolate a pod: the
// controller's last model (SetModel).
type Names struct {
	byAddr map[netip.Addr]string
	pods   map[string]*netpol.ModelPod
	// chains are the pod keys of this node's per-pod chains, by chain
	// name (hashed names included).
	chains map[string]string
}

// NamesOf indexes m.
func NamesOf(m *netpol.Model) *Names {
	n := &Names{byAddr: map[netip.Addr]string{}, pods: map[string]*netpol.ModelPod{}, chains: map[string]string{}}
	if m == nil {
		return n
	}
	for i := range m.Pods {
		p := &m.Pods[i]
		n.pods[p.Pod] = p
		if !p.HostNetwork {
			for _, a := range p.IPs {
				n.byAddr[a.Unmap()] = p.Pod
			}
		}
		if p.Local {
			for _, dir := range []string{"ingress", "egress"} {
				n.chains[table.ChainName(dir, p.Pod)] = p.Pod
			}
		}
	}
	return n
}

// Pod is the pod that has a ("" when none).
func (n *Names) Pod(a netip.Addr) string { return n.byAddr[a.Unmap()] }

// Isolating are the policies that isolate pod in dir.
func (n *Names) Isolating(pod, dir string) []string {
	p := n.pods[pod]
	if p == nil {
		return nil
	}
	iso := p.Ingress
	if dir == "egress" {
		iso = p.Egress
	}
	if iso == nil {
		return nil
	}
	return iso.Policies
}

// PodOfChain is the pod of a per-pod chain of this node ("" when the
// model does not know it).
func (n *Names) PodOfChain(chain string) string { return n.chains[chain] }

type entry struct {
	key  key
	drop Drop
}

type key struct {
	src, dst  string
	proto     table.Proto
	port      uint16
	direction string
}

// Recorder aggregates the samples of one network.
type Recorder struct {
	network string
	max     int

	mu      sync.Mutex
	names   *Names
	drops   map[key]*list.Element // of *entry
	order   *list.List            // the latest first
	samples uint64
	changed bool
}

// NewRecorder keeps the max (DefaultMax when 0) latest Drops of network.
func NewRecorder(network string, max int) *Recorder {
	if max <= 0 {
		max = DefaultMax
	}
	return &Recorder{network: network, max: max, names: NamesOf(nil), drops: map[key]*list.Element{}, order: list.New()}
}

// SetModel makes m the names of the samples from now on (the controller
// calls it with each model it writes).
func (r *Recorder) SetModel(m *netpol.Model) {
	n := NamesOf(m)
	r.mu.Lock()
	r.names = n
	r.mu.Unlock()
}

// Names are the names SetModel last set.
func (r *Recorder) Names() *Names {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names
}

// Add records a sample with NFLOG prefix prefix and payload b that came
// at t; false when it is not one of this network's policy drops or does
// not parse. It returns the sample's direction.
func (r *Recorder) Add(prefix string, b []byte, t time.Time) (string, bool) {
	dir, _, ok := table.ParsePrefix(prefix)
	if !ok || prefix != table.LogPrefix(dir, r.network) {
		return "", false
	}
	p, err := Parse(b)
	if err != nil {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	src := Endpoint{Pod: r.names.Pod(p.Src), Address: p.Src}
	dst := Endpoint{Pod: r.names.Pod(p.Dst), Address: p.Dst}
	k := key{src: src.String(), dst: dst.String(), proto: p.Proto, port: p.DstPort, direction: dir}
	r.samples++
	r.changed = true
	dropper := dst.Pod
	if dir == "egress" {
		dropper = src.Pod
	}
	policies := r.names.Isolating(dropper, dir)
	if e, ok := r.drops[k]; ok {
		d := &e.Value.(*entry).drop
		d.Count++
		d.Last = t
		d.Source.Address, d.Destination.Address = p.Src, p.Dst
		if !slices.Equal(d.Policies, policies) {
			d.Policies = slices.Clone(policies)
		}
		r.order.MoveToFront(e)
		return dir, true
	}
	d := Drop{Direction: dir, Source: src, Destination: dst, Proto: protoName(p.Proto), Port: p.DstPort,
		Policies: slices.Clone(policies), Count: 1, First: t, Last: t}
	r.drops[k] = r.order.PushFront(&entry{k, d})
	for r.order.Len() > r.max {
		old := r.order.Back()
		delete(r.drops, old.Value.(*entry).key)
		r.order.Remove(old)
	}
	return dir, true
}

// File is what r holds, the latest Drop first, and whether it changed
// since the last call.
func (r *Recorder) File(now time.Time) (File, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := File{Network: r.network, Time: now, Samples: r.samples, Drops: make([]Drop, 0, r.order.Len())}
	for e := r.order.Front(); e != nil; e = e.Next() {
		f.Drops = append(f.Drops, e.Value.(*entry).drop)
	}
	changed := r.changed
	r.changed = false
	return f, changed
}

func protoName(p table.Proto) string {
	switch p {
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return p.String()
}
