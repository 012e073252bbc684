package village

import (
	"errors"
	"io/fs"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// bridgeSysctls is where the kernel shows br_netfilter's settings for the
// reader's network namespace; the directory exists only while the module
// is loaded.
const bridgeSysctls = "/proc/sys/net/bridge"

// Status is the CNI STATUS verb: ready when bridged traffic can reach
// netfilter on this node and every IPAM plugin is ready.
func Status(args *skel.CmdArgs) error {
	if err := checkBrNetfilter(bridgeSysctls); err != nil {
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
	_, err := os.Stat(dir)
	if err == nil {
		return nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return types.NewError(types.ErrPluginNotAvailable,
			"br_netfilter is not loaded on this node ("+dir+" is missing): Services whose endpoint is on the client pod's own node would not answer; load it with `modprobe br_netfilter` (and list it in /etc/modules-load.d/ to keep it after a reboot)", "")
	}
	return types.NewError(types.ErrPluginNotAvailable, "failed to check for br_netfilter: "+err.Error(), "")
}
