package village

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netsetup"
)

// Status is the CNI STATUS verb: ready when bridged traffic can reach
// netfilter on this node and every IPAM plugin is ready.
func Status(args *skel.CmdArgs) error {
	if err := checkBrNetfilter(netsetup.BridgeNetfilterPath); err != nil {
		return err
	}
	return forEachIPAM(args, ipamCall.Status)
}

// checkBrNetfilter fails with code 50 (the plugin is not available) when dir,
// br_netfilter's sysctl directory, is absent. Without the module, traffic
// between two pods of one bridge is never seen by netfilter, so a Service
// whose endpoint is on the client's own node (kube-proxy's DNAT) gets no
// reply: the node would take pods it cannot serve, as kubeadm's preflight
// check also holds. Failing STATUS keeps such a node not ready, with the
// fix in the message.
func checkBrNetfilter(dir string) error {
	if err := netsetup.BridgeNetfilterLoadedAt(dir); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return nil
}
