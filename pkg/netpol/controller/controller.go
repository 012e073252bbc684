// Package controller is villaged's NetworkPolicy controller: it follows
// NetworkPolicies, Pods and Namespaces through the agent's shared
// informers, compiles them with pkg/netpol for this node's pods whenever
// they change (a burst of changes is one compile), installs the result with pkg/netpol/table, repairs the
// kernel when it drifts, reports what it cannot enforce as Events and log
// lines, and writes the namespaces file ADD reads, a status file
// `villaged status` reads and the model of what is in the kernel
// (netpol.Model) `villaged why` reads.
package controller

import (
	"context"
	"encoding/json"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/metrics"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// Defaults.
const (
	DefaultSettle = 100 * time.Millisecond
	DefaultRepair = 10 * time.Second
)

// Config says which network and node the controller works for.
type Config struct {
	Network string
	// Bridge is the network's bridge (table.Ruleset.Bridge).
	Bridge string
	Node   string
	// Pods (every pod of the cluster, with SlimPod as their transform),
	// Namespaces and Policies are the agent's shared informers, which the
	// agent starts.
	Pods, Namespaces, Policies cache.SharedIndexInformer
	// Events records the Warnings on NetworkPolicies (the agent's one
	// recorder).
	Events record.EventRecorder
	// RunDir is where the namespaces and status files go ("" = the
	// default run directory).
	RunDir string
	// Settle is how long after a change the compile waits for more.
	Settle time.Duration
	// Repair is how often the kernel is compared with the last compile
	// (the agent's safety net: its tables' notifications, Kick, start the
	// repair as soon as they change).
	Repair time.Duration
	// Retry is how often a failed apply is tried again (DefaultRepair
	// when 0; the agent's tick), whatever Repair is.
	Retry   time.Duration
	Metrics *metrics.Metrics
	// LAN reports whether a pod of this node has a LAN interface (net1,
	// which no policy filters: the NetworkPolicyNotEnforced warning), as
	// the node's own state says (pkg/lanpods HasLAN); nil: no pod has one.
	// Never the lan-address annotation, which users may edit.
	LAN func(*corev1.Pod) bool
	// LANChanged receives when LAN's answers may have changed (nil:
	// never): the controller compiles again.
	LANChanged <-chan struct{}
	Logf       func(string, ...any)
	// InNS runs its argument in the node's network namespace (nil: the
	// calling thread's, which is the node's for villaged).
	InNS func(func() error) error
	// Model, when set, receives each new model of what the kernel holds
	// (the one written to the model file): pkg/netpol/drops names the
	// dropped packets with it.
	Model func(*netpol.Model)
	// Kick receives when the kernel says the policy or pending table
	// changed (villaged: pkg/nftwatch; nil: never): the controller repairs
	// at once, as on its Repair tick, which writes nothing when the kernel
	// holds what it compiled.
	Kick <-chan struct{}
	// Marks is what the pending sets held as their notifications told
	// (villaged: pkg/nftwatch; nil: nothing known): a repair that finds
	// the pending table deleted writes these marks back with it.
	Marks *table.Marks
}

// StatusName is the status file under <run dir>/<network>/.
const StatusName = nodelocal.PolicyStatusName

// Status is what the controller last did, for `villaged status`.
type Status struct {
	Time     time.Time     `json:"time"`
	Policies int           `json:"policies"`
	Pods     int           `json:"pods"`     // local pods isolated in a direction
	Compiled int           `json:"compiled"` // local pods seen, host-network ones aside
	Problems []string      `json:"problems,omitempty"`
	Error    string        `json:"error,omitempty"`
	Want     table.Summary `json:"want"`
}

// StatusPath is the status file of network (nodelocal.PolicyStatus).
func StatusPath(runDir, network string) string { return nodelocal.PolicyStatus(runDir, network) }

// ModelPath is the model file of network (nodelocal.PolicyModel).
func ModelPath(runDir, network string) string { return nodelocal.PolicyModel(runDir, network) }

// Disable removes everything the controller installs: both tables, the
// namespaces file (so ADD marks nothing), the ready file, the status file,
// the model file (so `villaged why` says policy is not compiled) and the
// drops file.
func Disable(runDir, network string) error {
	_ = os.Remove(table.NamespacesPath(runDir, network))
	_ = os.Remove(table.ReadyPath(runDir, network))
	_ = os.Remove(StatusPath(runDir, network))
	_ = os.Remove(ModelPath(runDir, network))
	_ = os.Remove(nodelocal.PolicyDrops(runDir, network))
	return table.Remove(network)
}

// Run works until ctx is done; the tables stay when it returns, so
// enforcement continues while villaged restarts.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Settle <= 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Repair <= 0 {
		cfg.Repair = DefaultRepair
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRepair
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.InNS == nil {
		cfg.InNS = func(f func() error) error { return f() }
	}
	pods, nss, pols := cfg.Pods, cfg.Namespaces, cfg.Policies
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { poke() }, DeleteFunc: func(any) { poke() },
		UpdateFunc: func(old, cur any) {
			if compileReads(old, cur) {
				poke()
			}
		}}
	var synced []cache.InformerSynced
	for _, inf := range []cache.SharedIndexInformer{pods, nss, pols} {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return err
		}
		defer func() { _ = inf.RemoveEventHandler(reg) }()
		synced = append(synced, reg.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	c := &ctl{cfg: cfg, pods: pods.GetStore(), nss: nss.GetStore(), pols: pols.GetStore(),
		rec: cfg.Events, reported: map[table.Problem]bool{}}
	defer c.release()
	defer c.startModels(ctx)()
	c.sync("start")
	repair := time.NewTicker(cfg.Repair)
	defer repair.Stop()
	retry := time.NewTicker(cfg.Retry)
	defer retry.Stop()
	var settled <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			if settled == nil {
				settled = time.After(cfg.Settle)
			}
		case <-cfg.LANChanged:
			poke()
		case <-settled:
			settled = nil
			c.sync("change")
		case <-repair.C:
			c.repair()
		case <-retry.C:
			if c.failed {
				c.sync("retry")
			}
		case <-cfg.Kick:
			c.repair()
		}
	}
}

type ctl struct {
	cfg             Config
	pods, nss, pols cache.Store
	rec             record.EventRecorder
	reported        map[table.Problem]bool
	last            *table.Ruleset
	lastCounts      [2]int // policies, local pods of last
	failed          bool
	// models takes the input of each compile the kernel holds to the
	// goroutine that writes its model (startModels; nil: sync writes it
	// itself), so that a large cluster's model never delays the next
	// compile. model is the file's content as last written (nil: to
	// write), the writer's own.
	models chan netpol.Input
	model  []byte
	// ready is the ready file, held from the first compile in the
	// kernel until Run returns (ready.go).
	ready *os.File
}

// input reads the caches.
func (c *ctl) input() netpol.Input {
	in := netpol.Input{Network: c.cfg.Network, Bridge: c.cfg.Bridge, Namespaces: map[string]map[string]string{}, Local: map[string]bool{}}
	for _, o := range c.pols.List() {
		in.Policies = append(in.Policies, o.(*networkingv1.NetworkPolicy))
	}
	for _, o := range c.nss.List() {
		ns := o.(*corev1.Namespace)
		in.Namespaces[ns.Name] = ns.Labels
	}
	for _, o := range c.pods.List() {
		p := o.(*corev1.Pod)
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // its address may already be another pod's
		}
		np := podOf(p)
		in.Pods = append(in.Pods, np)
		if p.Spec.NodeName == c.cfg.Node {
			in.Local[np.Key()] = true
			np.LAN = c.cfg.LAN != nil && c.cfg.LAN(p)
		}
	}
	return in
}

func podOf(p *corev1.Pod) *netpol.Pod {
	np := &netpol.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, HostNetwork: p.Spec.HostNetwork}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			np.IPs = append(np.IPs, a.Unmap())
		}
	}
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, ct := range cs {
			for _, cp := range ct.Ports {
				if cp.Name == "" {
					continue
				}
				proto := table.ProtoTCP
				switch cp.Protocol {
				case corev1.ProtocolUDP:
					proto = table.ProtoUDP
				case corev1.ProtocolSCTP:
					proto = table.ProtoSCTP
				}
				np.Ports = append(np.Ports, netpol.NamedPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
			}
		}
	}
	return np
}

// sync compiles and, when the result differs from the last one applied,
// updates the kernel by the difference (rewrites it whole when the last
// apply failed).
func (c *ctl) sync(why string) { c.write(why, false) }

// write compiles and writes what the compile changed; force writes even
// when the compile equals the last one (the repair of a missing pending
// table, which the difference makes again).
func (c *ctl) write(why string, force bool) {
	start := time.Now()
	in := c.input()
	rs := netpol.Compile(in)
	// the counts too: the status file reports them
	counts := [2]int{len(in.Policies), len(in.Local)}
	if !force && !c.failed && c.last != nil && counts == c.lastCounts && table.Equal(rs, c.last) {
		// The kernel holds it already; the model may still change (a
		// policy that selects only other nodes' pods, a rule's place).
		c.queueModel(in)
		return
	}
	c.report(rs)
	// Only what changed goes to the kernel, unless the last apply failed
	// or the kernel drifted (then the whole table is written again).
	var err error
	if c.failed || c.last == nil {
		err = c.cfg.InNS(func() error { return table.Apply(rs) })
	} else {
		err = c.cfg.InNS(func() error { return table.Update(c.last, rs) })
	}
	if err == nil {
		err = table.WriteNamespaces(table.NamespacesPath(c.cfg.RunDir, c.cfg.Network), rs.Namespaces)
	}
	if err == nil {
		err = c.holdReady()
	}
	d := time.Since(start)
	c.cfg.Metrics.ObservePolicy(c.cfg.Network, d, err, len(rs.Pods), len(rs.Problems))
	c.failed = err != nil
	if err != nil {
		c.cfg.Logf("network policy (%s): %v", why, err)
	} else {
		c.last, c.lastCounts = rs, counts
		c.queueModel(in)
		c.cfg.Logf("network policy (%s): %d policies, %d of %d local pods isolated, %d peer sets, in the kernel after %s", why, len(in.Policies), len(rs.Pods), countLocal(in), len(rs.Sets), d.Round(time.Microsecond))
	}
	c.writeStatus(in, rs, err)
}

// countLocal is the number of this node's pods whose traffic the compile
// covers: host-network pods (the agent's own, kube-proxy) share the
// node's addresses and are never filtered, so they are not counted.
func countLocal(in netpol.Input) int {
	n := 0
	for _, p := range in.Pods {
		if in.Local[p.Key()] && !p.HostNetwork {
			n++
		}
	}
	return n
}

// repair compares the kernel with the last compile and applies again when
// they differ (a flushed table, a hand edit) or the last apply failed. A
// missing pending table means new pods would go unmarked: the ready file
// is let go first (ADD marks every new pod pending again, making the
// table itself if need be), the table is made again at once, alone, with
// the marks it held (Config.Marks), before the policy table is even read,
// and the ready file is taken again once the compile that follows is in
// the kernel; that compile's write takes the marks of the pods it covers
// out again.
func (c *ctl) repair() {
	if c.failed || c.last == nil {
		c.sync("retry")
		return
	}
	var pending bool
	err := c.cfg.InNS(func() (err error) {
		pending, err = table.PendingPresent(c.cfg.Network)
		return err
	})
	if err != nil {
		c.cfg.Logf("network policy: reading the kernel: %v", err)
		return
	}
	if !pending {
		c.release()
		start := time.Now()
		marks := c.cfg.Marks.Addrs()
		err := c.cfg.InNS(func() error { return table.EnsurePending(c.cfg.Network, c.last.Bridge, marks) })
		if err != nil {
			c.cfg.Logf("network policy (repair): %v", err)
		} else {
			c.cfg.Logf("network policy (repair): the pending table made again after %s, with the %d marks it held", time.Since(start).Round(time.Microsecond), len(marks))
		}
	}
	var have table.Summary
	var ok bool
	err = c.cfg.InNS(func() (err error) {
		have, ok, err = table.Observe(c.cfg.Network)
		return err
	})
	if err != nil {
		c.cfg.Logf("network policy: reading the kernel: %v", err)
		if !pending {
			c.failed = true
			c.sync("repair")
		}
		return
	}
	policy := "table missing"
	if ok {
		policy = table.Diff(table.Summarize(c.last), have)
	}
	diff := policy
	if !pending {
		diff = strings.TrimPrefix(diff+"; pending table missing (not ready until it is back)", "; ")
	}
	if diff == "" {
		return
	}
	if !pending {
		// The pending table went with its marks: a pod added since the
		// last compile lost its mark, so the repair compiles again from
		// what the informers hold now and writes that: the policy table
		// whole when it drifted too, else only its difference (and the
		// pending table, had making it above failed).
		c.cfg.Logf("network policy: the kernel drifted (%s): compiling again", diff)
		c.failed = policy != ""
		c.write("repair", true)
		return
	}
	// Only the policy table drifted and every pending mark is there: the
	// last compile, which the kernel held, goes back as it was, with no
	// compile again. A pod added since keeps its mark until its own
	// compile (a change is its own sync).
	c.cfg.Logf("network policy: the kernel drifted (%s): applying the last compile again", diff)
	start := time.Now()
	err = c.cfg.InNS(func() error { return table.Apply(c.last) })
	if err == nil {
		d := time.Since(start)
		c.cfg.Metrics.ObservePolicy(c.cfg.Network, d, nil, len(c.last.Pods), len(c.last.Problems))
		c.cfg.Logf("network policy (repair): in the kernel after %s", d.Round(time.Microsecond))
		return
	}
	c.cfg.Logf("network policy (repair): %v; compiling again", err)
	c.failed = true
	c.sync("repair")
}

// report logs and records as an Event each problem once (again after it
// went away and came back).
func (c *ctl) report(rs *table.Ruleset) {
	now := map[table.Problem]bool{}
	for _, p := range rs.Problems {
		now[p] = true
		if c.reported[p] {
			continue
		}
		c.cfg.Logf("network policy: not enforced: %s", p)
		if o, ok, _ := c.pols.GetByKey(p.Policy); ok {
			c.rec.Event(o.(*networkingv1.NetworkPolicy), corev1.EventTypeWarning, kubenames.ReasonPolicyNotEnforced, "node "+c.cfg.Node+": "+p.Reason)
		}
	}
	c.reported = now
}

func (c *ctl) writeStatus(in netpol.Input, rs *table.Ruleset, err error) {
	st := Status{Time: time.Now().UTC(), Policies: len(in.Policies), Pods: len(rs.Pods), Compiled: countLocal(in), Want: table.Summarize(rs)}
	for _, p := range rs.Problems {
		st.Problems = append(st.Problems, p.String())
	}
	if err != nil {
		st.Error = err.Error()
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	path := StatusPath(c.cfg.RunDir, c.cfg.Network)
	if werr := nodelocal.WriteFile(path, b, 0o644); werr != nil {
		c.cfg.Logf("policy status: %v", werr)
	}
}

// startModels starts the goroutine that writes the models queueModel
// hands it, the latest input only; stop ends it once it has written what
// it was writing.
func (c *ctl) startModels(ctx context.Context) (stop func()) {
	c.models = make(chan netpol.Input, 1)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case in := <-c.models:
				c.writeModel(in)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// queueModel has the model of in written: by the writer, in place of an
// input it has not taken yet (sync is the only sender, so the send never
// blocks), or here when there is no writer.
func (c *ctl) queueModel(in netpol.Input) {
	if c.models == nil {
		c.writeModel(in)
		return
	}
	select {
	case <-c.models:
	default:
	}
	c.models <- in
}

// writeModel writes the model of in, which the kernel holds, when it
// differs from the one last written.
func (c *ctl) writeModel(in netpol.Input) {
	m := netpol.BuildModel(in)
	b, err := json.Marshal(m)
	if err != nil {
		c.cfg.Logf("policy model: %v", err)
		return
	}
	if c.model != nil && string(b) == string(c.model) {
		return
	}
	if c.cfg.Model != nil {
		c.cfg.Model(m)
	}
	// Root only: the model names every pod, address and policy of the
	// cluster, more than a local user of the node may read elsewhere.
	if err := nodelocal.WriteFile(ModelPath(c.cfg.RunDir, c.cfg.Network), b, 0o600); err != nil {
		c.cfg.Logf("policy model: %v", err)
		c.model = nil
		return
	}
	c.model = b
}

// ReadModel reads the model file of network (nil, nil when missing).
func ReadModel(runDir, network string) (*netpol.Model, error) {
	var m netpol.Model
	if found, err := nodelocal.ReadJSON(ModelPath(runDir, network), &m); !found {
		return nil, err
	}
	return &m, nil
}

// ReadStatus reads the status file of network (nil, nil when missing).
func ReadStatus(runDir, network string) (*Status, error) {
	var st Status
	if found, err := nodelocal.ReadJSON(StatusPath(runDir, network), &st); !found {
		return nil, err
	}
	return &st, nil
}

// compileReads reports whether an update changed what the compile reads:
// a Pod's slimmed fields (a starting pod's condition and container status
// writes change none of them: one compile per pod start instead of one
// per write), a Namespace's labels; a NetworkPolicy's update always.
func compileReads(old, cur any) bool {
	switch c := cur.(type) {
	case *corev1.Pod:
		o, ok := old.(*corev1.Pod)
		if !ok {
			return true
		}
		a, b := *o, *c
		a.ResourceVersion, b.ResourceVersion = "", ""
		return !reflect.DeepEqual(&a, &b)
	case *corev1.Namespace:
		o, ok := old.(*corev1.Namespace)
		return !ok || !maps.Equal(o.Labels, c.Labels)
	}
	return true
}

// SlimPod keeps of a Pod only what the compile reads, and Village's own
// annotations (the LAN pods controller reads those from the same cache),
// so the cache of every pod of the cluster stays small: the transform of
// the agent's Pod informer.
func SlimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
		ResourceVersion: p.ResourceVersion, Labels: p.Labels}}
	for k, v := range p.Annotations {
		if strings.HasPrefix(k, kubenames.Prefix) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	out.Spec.NodeName, out.Spec.HostNetwork = p.Spec.NodeName, p.Spec.HostNetwork
	out.Spec.Containers = portsOnly(p.Spec.Containers)
	out.Spec.InitContainers = portsOnly(p.Spec.InitContainers)
	out.Status.Phase, out.Status.PodIPs = p.Status.Phase, p.Status.PodIPs
	return out, nil
}

func portsOnly(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name != "" }) {
			out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return out
}

// holdReady takes the ready file once the first compile is in the kernel
// and the namespaces file written: from then on ADD marks only pods of
// namespaces with a policy (table.MarkUntilReady).
func (c *ctl) holdReady() error {
	if c.ready != nil {
		return nil
	}
	f, err := table.HoldReady(table.ReadyPath(c.cfg.RunDir, c.cfg.Network))
	if err != nil {
		return err
	}
	c.ready = f
	c.cfg.Logf("network policy: first compile in the kernel; new pods are marked pending only in namespaces with a policy")
	return nil
}

// release lets go of the ready file: ADD marks every new pod pending
// again until a controller has compiled.
func (c *ctl) release() {
	if c.ready != nil {
		_ = c.ready.Close()
		c.ready = nil
	}
}
