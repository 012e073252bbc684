// Package village implements the CNI verbs of the `village` main plugin:
// each pod gets CNI_IFNAME (eth0) as one end of a veth pair whose other end
// is a port of the node bridge that holds the pod subnet's gateway.
//
// ADD is a sequence of idempotent ensure steps — IPAM first (so a full range
// touches no link), then the backend's static peers (which fix the pod MTU),
// the bridge, the veth, the pod's addresses and routes, the gateway,
// forwarding and masquerade, and last the optional LAN macvlan with its own
// IPAM call — each pushing its undo on a cleanup stack so that a failure
// part-way leaves nothing behind. The second and later pods on a node find
// the bridge, gateway, masquerade and peers already in place and pay only
// for their own veth.
package village

import (
	"time"

	"github.com/containernetworking/cni/pkg/skel"
)

const ipamDeadline = 2 * time.Minute

// Funcs are the verbs for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: Add, Del: Del, Check: Check, Status: Status, GC: GC}
}
