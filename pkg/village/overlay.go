package village

import (
	"context"
	"fmt"
	"net"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/overlay"
)

// overlayDeadline bounds the netlink work of one reconcile from the plugin.
const overlayDeadline = 30 * time.Second

// podSubnets returns the subnets of addresses (this node's pod subnets).
func podSubnets(ips []*current.IPConfig) []*net.IPNet {
	var out []*net.IPNet
	for _, ipc := range ips {
		out = append(out, cidr.Network(&ipc.Address))
	}
	return out
}

// syncOverlay makes the kernel carry traffic to the other nodes and returns
// the MTU pods should use. With static peers it reconciles them (a peer
// removed from the list is removed here); with a registry villaged owns the
// peers and this only reads the pod MTU without writing anything (for auto:
// the device's while villaged keeps one, else the underlay's). A second
// ADD on an unchanged node costs a few netlink dumps.
func syncOverlay(conf *netconf.NetConf, ips []*current.IPConfig) (int, error) {
	b := conf.Overlay
	if !b.Routes() {
		return 0, nil
	}
	r, err := overlay.New(b.OverlayConfig(conf.Name))
	if err != nil {
		return 0, fmt.Errorf("backend %s: %w", b.Type, err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), overlayDeadline)
	defer cancel()
	self := overlay.Node{PodCIDRs: podSubnets(ips)}
	if b.Registry != nil {
		mtu, err := r.PodMTU(self)
		if err != nil {
			return 0, fmt.Errorf("backend %s: reading the underlay: %w", b.Type, err)
		}
		return mtu, nil
	}
	rep, err := r.Set(ctx, self, b.Peers())
	if err != nil {
		return rep.MTU, fmt.Errorf("backend %s: reconciling %d static peers: %w", b.Type, len(b.Nodes), err)
	}
	return rep.MTU, nil
}

// ensureOverlay is the ADD step: peers first, so the pod MTU is known before
// the bridge and the veth are made. The peers' routes need this node's pod
// subnets, so with a backend it takes the pod's addresses first.
func (a *adder) ensureOverlay() error {
	if !a.conf.Overlay.Routes() {
		a.mtu = a.conf.PodMTU(0)
		return nil
	}
	if err := a.podAddresses(); err != nil {
		return err
	}
	mtu, err := syncOverlay(a.conf, a.result.IPs)
	if err != nil {
		return err
	}
	a.mtu = a.conf.PodMTU(mtu)
	return nil
}
