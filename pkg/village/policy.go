package village

import (
	"net/netip"

	"github.com/village-cni/village/pkg/netpol/table"
)

// markPolicyPending marks the pod's addresses pending in the network's
// policy tables when its namespace holds a NetworkPolicy (see
// table.MarkNewPod): its traffic drops until villaged has compiled its
// rules, so a pod a deny policy selects is never reachable before them.
// With "networkPolicy": true and no running controller that has compiled
// (first boot, reboot, agent down or restarting), every pod is marked
// whatever the namespaces file says (table.MarkUntilReady): fail closed.
// Otherwise nothing happens (no nftables call) without villaged's
// namespace file.
func (a *adder) markPolicyPending() error {
	var ips []netip.Addr
	for _, ipc := range a.result.IPs {
		if ip, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			ips = append(ips, ip.Unmap())
		}
	}
	if a.conf.NetworkPolicy {
		if marked, err := table.MarkUntilReady("", a.conf.Name, a.conf.Bridge, ips); err != nil || marked {
			return err
		}
	}
	_, err := table.MarkNewPod("", a.conf.Name, a.conf.Bridge, a.conf.Pod.Namespace, ips, a.conf.NetworkPolicy)
	return err
}
