package agent

import (
	"context"
	"fmt"
	"sync"

	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/metrics"
)

// masqFeature keeps the network's netfilter rules (masquerade, forward
// accept, every pod's macspoofchk rule) through masq.Keep, as the plugin's
// ADD does. Its keeper goroutine is the rules' one owner in the agent: it
// runs masq.Keep on every nftables notification about the tables the
// rules live in (nftables.go), and when the loop asks (keep): the first
// peer list (or the start with static peers), every safety net, and every
// tick on a legacy iptables host, whose rules send no notification
// (masqOnTick). It sets a.masq, and is started after the nftables watch
// and the pod subnets are known (the rules name them).
type masqFeature struct{}

func (masqFeature) Name() string { return "masquerade" }

func (masqFeature) Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error {
	k := &masqKeeper{
		spec:    a.c.netfilter(a.self.PodCIDRs),
		node:    masq.Node{Bridge: a.c.Net.Bridge, Agent: true, RunDir: a.opts.RunDir},
		network: a.c.Net.Name,
		m:       a.m,
		logf:    a.opts.logf,
		kick:    make(chan struct{}, 1),
	}
	a.masq = k
	changed := a.nft.masqChanged()
	wg.Go(func() { k.run(ctx, changed) })
	return nil
}

// Status is the rule set against what the config wants (masq.Check),
// when it wants any.
func (masqFeature) Status(_ context.Context, v *view) ([]string, bool) {
	s := v.masqSpec()
	if !s.WantsRules() {
		return nil, true
	}
	if err := masq.Check(s, v.masqNode()); err != nil {
		return []string{fmt.Sprintf("masquerade: DRIFT: %v", err)}, false
	}
	return []string{"masquerade: ok"}, true
}

// masqKeeper runs masq.Keep for one network, one call at a time.
type masqKeeper struct {
	spec    masq.Spec
	node    masq.Node
	network string
	m       *metrics.Metrics
	logf    func(string, ...any)
	// kick holds one request: asked for while a Keep runs, one more
	// runs after it, however often it was asked.
	kick chan struct{}
}

// keep asks the keeper for a pass without waiting for it (nothing on a
// nil keeper: an agent whose features were not started).
func (k *masqKeeper) keep() {
	if k == nil {
		return
	}
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// run keeps the rules on every notification on changed and every keep
// until ctx is done.
func (k *masqKeeper) run(ctx context.Context, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-k.kick:
		}
		k.pass()
	}
}

// pass is one masq.Keep: it costs one fingerprint read when nothing
// changed. Rules installed where none were recorded (before the first
// ADD) are not drift; rules gone behind Village's back are, and count in
// the drift metrics.
func (k *masqKeeper) pass() {
	res, err := masq.Keep(k.spec, k.node)
	repaired := res.Drift()
	if err != nil {
		repaired = 0
		k.logf("keeping the netfilter rules of network %q: %v", k.network, err)
	}
	k.m.AddDrift(res.Drift(), repaired)
	k.m.NetfilterKept(err)
	if res.Repaired != "" {
		k.logf("netfilter rules of network %q drifted (%s): restored", k.network, res.Repaired)
	}
	if len(res.SpoofRestored) > 0 {
		k.logf("macspoofchk rules of %v (network %q) were gone: restored", res.SpoofRestored, k.network)
	}
	if res.Installed {
		k.logf("netfilter rules of network %q installed", k.network)
	}
}
