// Package village implements the CNI verbs of the `village` main plugin:
// each pod gets CNI_IFNAME (eth0) as one end of a veth pair whose other end
// is a port of the node bridge that holds the pod subnet's gateway.
//
// ADD forks the IPAM plugin before anything else and gives it its input
// once the config and the pod namespace passed their checks (a claim, see
// claim.go; the LAN interface of a macvlan section gets a second claim).
// While the plugins claim the addresses, ADD runs a sequence of idempotent
// ensure steps: the backend's static peers (which fix the pod MTU, and wait
// for the pod's addresses, whose subnets their routes need), the bridge,
// the veth; then, with the addresses, the pod's addresses and routes, the
// gateway, forwarding and the netfilter rules, and the LAN macvlan. Each
// step that makes something of this pod, and each claim, pushes its undo on
// a cleanup stack, so that a failure part-way leaves nothing of the pod
// behind: its links are deleted and its addresses released. A full range
// thus fails the ADD after the veth was made, and the veth is removed again;
// the bridge, shared by the node's pods, stays. The second and later pods
// on a node find the bridge, gateway, netfilter rules and peers already in
// place and pay only for their own veth.
//
// CHECK only reads: it reports what drifted (code 110 in the pod, 111 on
// the node) and changes nothing; ADD and villaged repair.
package village

import (
	"time"

	"github.com/containernetworking/cni/pkg/skel"
)

const ipamDeadline = 2 * time.Minute

// Funcs are the verbs for skel.PluginMainFuncs; their errors carry the
// plugin's marker (errmark.go).
func Funcs() skel.CNIFuncs {
	return marked(Plugin, skel.CNIFuncs{Add: Add, Del: Del, Check: Check, Status: Status, GC: GC})
}
