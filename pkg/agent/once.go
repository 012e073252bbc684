package agent

import (
	"context"
	"fmt"
	"io"

	"github.com/village-cni/village/pkg/masq"
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

// Status is `villaged status`: every feature's lines (feature.go; the
// overlay's first: this node, its subnet, its registration, each peer with
// whether its route, neighbour and FDB entries are in place, stale
// entries; then the masquerade rule set and the others), the API
// confinement, bridge netfilter, and the orphans. It writes nothing. clean
// is false when anything drifted.
func Status(ctx context.Context, opts Options, w io.Writer) (clean bool, err error) {
	v, err := readView(ctx, opts)
	if err != nil {
		return false, err
	}
	defer v.close()
	st := &status{}
	st.features, st.clean = featuresStatus(ctx, v) // feature.go
	var confined bool
	st.confine, confined = confinementStatus(opts.RunDir, v.c.Net.Name, v.c.usesAPI()) // confine.go
	st.clean = st.clean && confined
	if err := netsetup.BridgeNetfilterLoaded(); err != nil {
		st.clean = false
		st.bridgeNF = "bridge netfilter: MISSING: " + err.Error()
	} else {
		st.bridgeNF = "bridge netfilter: ok (br_netfilter loaded; Village's bridges pass bridged IPv4 and IPv6 to iptables/nftables)"
	}
	if st.orphans, st.foreign, err = v.c.Orphans(v.self.PodCIDRs); err != nil {
		return false, err
	}
	if len(st.orphans) > 0 {
		st.clean = false
	}
	st.print(w)
	return st.clean, nil
}

// status is what `villaged status` found, gathered before anything is
// printed.
type status struct {
	features []string // the features' lines (feature.go), the overlay's first
	confine  []string // the API confinement (confine.go; nil without the API)
	bridgeNF string   // whether bridged pod traffic reaches netfilter
	orphans  []string
	foreign  []string
	clean    bool
}

// print writes the report, one fact a line.
func (st *status) print(w io.Writer) {
	for _, line := range st.features {
		fmt.Fprintln(w, line)
	}
	for _, line := range st.confine {
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w, st.bridgeNF)
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
