package agent

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/registry"
)

// view is the desired state as the one-shot commands read it, without
// writing anything to etcd.
type view struct {
	c       *Conf
	r       *overlay.Reconciler
	self    overlay.Node
	selfSrc string // where the pod subnets come from
	runDir  string // Options.RunDir
	peers   []overlay.Node
	// Registry only.
	src        source
	rev        int64
	registered *registry.Node // this node's record, nil when absent
	bad        error          // records that do not decode
	close      func()
}

// readView assembles the node as run does (openNode), then reads its pod
// subnets and the registry's list once, failing instead of waiting.
func readView(ctx context.Context, opts Options) (*view, error) {
	n, err := openNode(opts)
	if err != nil {
		return nil, err
	}
	c := n.c
	v := &view{c: c, r: n.r, src: n.src, close: n.close, runDir: opts.RunDir}
	fail := func(err error) (*view, error) { v.close(); return nil, err }
	if err := c.loadWireGuard(false); err != nil {
		return fail(err)
	}
	ip, err := n.underlayIP()
	if err != nil {
		return fail(err)
	}
	cidrs, src, err := c.podCIDRs(ctx, v.src)
	if err != nil {
		return fail(err)
	}
	if len(cidrs) == 0 {
		return fail(fmt.Errorf("node %s has no pod subnet: %s names no IPAM range, %s does not exist and the registry holds no subnet for it; start `villaged run` first", c.Node, c.File, c.SubnetFile))
	}
	v.self, v.selfSrc = n.self(ip, cidrs), src
	var nodes []registry.Node
	if v.src != nil {
		if nodes, v.rev, v.bad, err = v.src.nodes(ctx); err != nil {
			return fail(err)
		}
		for _, rec := range nodes {
			if rec.Name == c.Node {
				v.registered = &rec
			}
		}
	}
	var errs []error
	v.peers, errs = n.peers(nodes)
	for _, e := range errs {
		v.bad = joinErr(v.bad, e)
	}
	return v, nil
}

func joinErr(a, b error) error {
	if a == nil {
		return b
	}
	return fmt.Errorf("%w; %w", a, b)
}

func (v *view) masqSpec() masq.Spec { return v.c.netfilter(v.self.PodCIDRs) }

// masqNode is where the network's netfilter state lives, as villaged sees it.
func (v *view) masqNode() masq.Node {
	return masq.Node{Bridge: v.c.Net.Bridge, Agent: true, RunDir: v.runDir}
}

// Sync is `villaged sync`: one reconcile pass against the static peers and
// the registry's list (read only: it neither registers nor leases), and the
// masquerade rule set when ipMasq is on. It prints what it changed. Under
// backend wireguard it needs userspace "never": a wireguard-go device
// would live only as long as this command.
func Sync(ctx context.Context, opts Options, w io.Writer) error {
	c, err := Load(opts)
	if err != nil {
		return err
	}
	if err := c.syncable(); err != nil {
		return err
	}
	v, err := readView(ctx, opts)
	if err != nil {
		return err
	}
	defer v.close()
	if v.bad != nil {
		fmt.Fprintf(w, "ignoring registry records: %v\n", v.bad)
	}
	pctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	rep, err := v.r.Set(pctx, v.self, v.peers)
	for _, ch := range rep.Applied {
		fmt.Fprintln(w, ch)
	}
	if err != nil {
		return fmt.Errorf("node %s, %d peers: %w", v.c.Node, len(v.peers), err)
	}
	res, err := masq.Keep(v.masqSpec(), v.masqNode())
	if err != nil {
		return err
	}
	if res.Repaired != "" {
		fmt.Fprintf(w, "restored the netfilter rules of network %q (%s)\n", v.c.Net.Name, res.Repaired)
	}
	if len(res.SpoofRestored) > 0 {
		fmt.Fprintf(w, "restored the macspoofchk rules of %v (network %q)\n", res.SpoofRestored, v.c.Net.Name)
	}
	if res.Installed {
		fmt.Fprintf(w, "installed the netfilter rules of network %q\n", v.c.Net.Name)
	}
	fmt.Fprintf(w, "node %s: %d peers in sync (%d changes)\n", v.c.Node, len(v.peers), len(rep.Applied))
	return nil
}

// Status is `villaged status`: this node, its subnet, its registration,
// each peer with whether its route, neighbour and FDB entries are in place,
// stale entries, and the masquerade rule set. It writes nothing. clean is
// false when anything drifted.
func Status(ctx context.Context, opts Options, w io.Writer) (clean bool, err error) {
	v, err := readView(ctx, opts)
	if err != nil {
		return false, err
	}
	defer v.close()
	st, err := v.status(ctx)
	if err != nil {
		return false, err
	}
	var confined bool
	st.confine, confined = confinementStatus(opts.RunDir, v.c.Net.Name, v.c.usesAPI()) // confine.go
	st.clean = st.clean && confined
	var featuresOK bool
	st.features, featuresOK = featuresStatus(ctx, v.c, opts.RunDir) // feature.go
	st.clean = st.clean && featuresOK
	st.print(w)
	return st.clean, nil
}

// status is what `villaged status` found, gathered before anything is
// printed.
type status struct {
	header, node string
	registry     []string // lines about the registration (nil without one)
	confine      []string // the API confinement (confine.go; nil without the API)
	peers        []overlay.Node
	byPeer       map[string][]string // what is wrong per peer
	okState      string              // a peer's state when nothing is wrong
	device       []string            // what is wrong with the device
	stale        []string            // owned objects nothing wants
	masq         string              // the masquerade line ("" without masquerade)
	bridgeNF     string              // whether bridged pod traffic reaches netfilter
	orphans      []string
	foreign      []string
	features     []string // the features' lines (feature.go)
	clean        bool
}

// status reads the kernel state against the view (without writing).
func (v *view) status(ctx context.Context) (*status, error) {
	d, err := v.r.Status(ctx, v.self, v.peers)
	if err != nil {
		return nil, fmt.Errorf("reading the kernel state of node %s: %w", v.c.Node, err)
	}
	c := v.c
	st := &status{clean: d.Clean(), byPeer: map[string][]string{}, okState: "ok: route, neighbour and FDB entries in place"}
	if c.Backend.Type == netconf.BackendHostGW {
		st.okState = "ok: route in place"
	}
	st.header = fmt.Sprintf("network %s: backend %s", c.Net.Name, c.Backend.Type)
	if d.Device != "" {
		st.header += fmt.Sprintf(", device %s", d.Device)
	}
	st.header += fmt.Sprintf(", underlay %s, pod MTU %d", d.Underlay, c.Net.PodMTU(d.MTU))
	st.node = fmt.Sprintf("node %s: %s, pod subnets %s (%s)", c.Node, v.self.IP, cidrList(v.self.PodCIDRs), v.selfSrc)
	if v.src != nil {
		want := record(c.Node, v.self.IP, v.self.PodCIDRs, c.wg)
		switch {
		case v.registered == nil:
			st.clean = false
			st.registry = append(st.registry, fmt.Sprintf("registry %s: NOT REGISTERED (is `villaged run` running?)", v.src.where()))
		case !v.registered.Equal(want):
			st.clean = false
			st.registry = append(st.registry, fmt.Sprintf("registry %s: registered as %+v, but this node is %+v", v.src.where(), *v.registered, want))
		default:
			st.registry = append(st.registry, fmt.Sprintf("registry %s: registered (revision %d)", v.src.where(), v.rev))
		}
		if v.bad != nil {
			st.registry = append(st.registry, fmt.Sprintf("registry: ignored records: %v", v.bad))
		}
	}
	for _, ch := range d.Changes {
		switch {
		case ch.Object.Peer != "":
			st.byPeer[ch.Object.Peer] = append(st.byPeer[ch.Object.Peer], describe(ch))
		case ch.Op == overlay.OpDelete:
			st.stale = append(st.stale, ch.Object.String())
		default:
			st.device = append(st.device, describe(ch))
		}
	}
	for _, p := range d.Problems {
		if peer := p.Change.Object.Peer; peer != "" {
			st.byPeer[peer] = append(st.byPeer[peer], "problem: "+p.Err.Error())
		} else {
			st.device = append(st.device, "problem: "+p.Err.Error())
		}
	}
	// A static list names every node, this one too; it is not its own peer.
	st.peers = slices.DeleteFunc(slices.Clone(v.peers), func(p overlay.Node) bool {
		return p.Name == v.self.Name || p.IP.Equal(v.self.IP)
	})
	slices.SortFunc(st.peers, func(a, b overlay.Node) int { return strings.Compare(a.Name, b.Name) })
	if s := v.masqSpec(); s.WantsRules() {
		if err := masq.Check(s, v.masqNode()); err != nil {
			st.clean = false
			st.masq = fmt.Sprintf("masquerade: DRIFT: %v", err)
		} else {
			st.masq = "masquerade: ok"
		}
	}
	if err := netsetup.BridgeNetfilterLoaded(); err != nil {
		st.clean = false
		st.bridgeNF = "bridge netfilter: MISSING: " + err.Error()
	} else {
		st.bridgeNF = "bridge netfilter: ok (br_netfilter loaded; Village's bridges pass bridged IPv4 and IPv6 to iptables/nftables)"
	}
	if st.orphans, st.foreign, err = c.Orphans(v.self.PodCIDRs); err != nil {
		return nil, err
	}
	if len(st.orphans) > 0 {
		st.clean = false
	}
	return st, nil
}

// print writes the report, one fact a line, peers as a table.
func (st *status) print(w io.Writer) {
	fmt.Fprintln(w, st.header)
	fmt.Fprintln(w, st.node)
	for _, line := range st.registry {
		fmt.Fprintln(w, line)
	}
	for _, line := range st.confine {
		fmt.Fprintln(w, line)
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintf(w, "peers (%d):\n", len(st.peers))
	for _, p := range st.peers {
		state := st.okState
		if len(st.byPeer[p.Name]) > 0 {
			state = "DRIFT"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Name, p.IP, cidrList(p.PodCIDRs), state)
		for _, line := range st.byPeer[p.Name] {
			fmt.Fprintf(tw, "  \t\t\t  %s\n", line)
		}
	}
	tw.Flush()
	for _, line := range st.device {
		fmt.Fprintf(w, "device: %s\n", line)
	}
	for _, line := range st.stale {
		fmt.Fprintf(w, "stale (owned, not wanted): %s\n", line)
	}
	if st.masq != "" {
		fmt.Fprintln(w, st.masq)
	}
	fmt.Fprintln(w, st.bridgeNF)
	for _, line := range st.features {
		fmt.Fprintln(w, line)
	}
	for _, o := range st.orphans {
		fmt.Fprintf(w, "orphan: %s\n", o)
	}
	for _, f := range st.foreign {
		fmt.Fprintf(w, "not Village's: %s\n", f)
	}
	if st.clean {
		fmt.Fprintln(w, "status: in sync")
	} else {
		fmt.Fprintln(w, "status: DRIFTED")
	}
}

// describe says what a change would fix, in words: "missing route ...".
func describe(ch overlay.Change) string {
	obj := string(ch.Object.Kind) + " " + ch.Object.Desc
	switch ch.Op {
	case overlay.OpAdd:
		return "missing " + obj
	case overlay.OpReplace:
		return "wrong " + obj
	default:
		return string(ch.Op) + " " + obj
	}
}
