package agent

import (
	"context"
	"fmt"
	"sync"
)

// feature is one of what `villaged run` runs and `villaged status`
// reports: the overlay (overlay.go: the kernel watch, the registry and the
// loop), the masquerade rules (masquerade.go), the LAN pods' DHCP client
// (dhcp.go), the LAN pods' answers on the agent socket (lanside.go),
// Services on the LAN (lansvc.go) and NetworkPolicy (netpol.go).
//
// A feature the config leaves off starts nothing (NetworkPolicy also
// removes what an earlier run with it on left). A feature takes from the
// agent only what it needs: the config, the Kubernetes side (whose
// informers Run has started), the metrics, and the features started
// before it (the LAN pods' DHCP client, the LAN pods' controller, the
// masquerade keeper the overlay's loop asks for passes).
type feature interface {
	// Name names the feature in the log.
	Name() string
	// Start starts the feature for a, its goroutines in wg until ctx is
	// done, and returns once what it serves exists. An error is a
	// configuration that cannot work: it stops run.
	Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error
	// Status is `villaged status`'s lines about the feature, read from
	// v (the config, the node, the registry's view), the kernel, the run
	// directory and the agent's socket (nil when it is off); ok is false
	// when it is not what it should be. It writes nothing.
	Status(ctx context.Context, v *view) (lines []string, ok bool)
}

// early are the features Run starts before it waits for the underlay
// address and the pod subnets: the LAN pods answer the plugin, and the LAN
// Services answer on the LAN, from the first second (an agent restarted
// while the API server is down answers from its kept state). late are
// started once the node's underlay address and pod subnets are known,
// after the nftables watch that kicks NetworkPolicy's and the masquerade's
// repairs: the masquerade keeper before the overlay, whose loop asks it
// for passes.
var (
	early = []feature{dhcpFeature{}, lanPodsFeature{}, lanServicesFeature{}}
	late  = []feature{policyFeature{}, masqFeature{}, overlayFeature{}}
)

// features are every feature, in the order `villaged status` reports
// them: the overlay and its masquerade first.
func features() []feature {
	return []feature{overlayFeature{}, masqFeature{}, dhcpFeature{}, lanPodsFeature{}, lanServicesFeature{}, policyFeature{}}
}

// start starts fs in order.
func (a *agent) start(ctx context.Context, wg *sync.WaitGroup, fs []feature) error {
	for _, f := range fs {
		if err := f.Start(ctx, a, wg); err != nil {
			return fmt.Errorf("%s: %w", f.Name(), err)
		}
	}
	return nil
}

// featuresStatus is every feature's status lines; ok is false when one is
// not what it should be.
func featuresStatus(ctx context.Context, v *view) (lines []string, ok bool) {
	ok = true
	for _, f := range features() {
		l, fok := f.Status(ctx, v)
		lines = append(lines, l...)
		ok = ok && fok
	}
	return lines, ok
}
