package agent

import (
	"fmt"
	"os"

	"github.com/village-cni/village/pkg/netconf"
)

// lanAllWarning is the warning about a LAN section that gives every pod the
// LAN interface ("macvlan.pods" "all", also what a config without the key
// means) on a Kubernetes node, "" otherwise. On Kubernetes that puts every
// pod of the node, CoreDNS and every tenant's included, on the LAN with no
// namespace allow-list: the shipped ConfigMaps say "annotated". "all" stays
// the default (the contract of configs without the key, and of runtimes
// without Kubernetes), so the agent says so at start and in `villaged
// status` instead (docs/security.md, "Pods on the LAN").
func lanAllWarning(c *Conf) string {
	if c.Net.LAN == nil || c.Net.LAN.Pods != netconf.PodsAll || !onKubernetes(c) {
		return ""
	}
	return fmt.Sprintf("WARNING: network %q gives EVERY pod of this Kubernetes node the LAN interface (\"macvlan.pods\" is %q, the default when left out): "+
		"set \"pods\": %q so only pods of namespaces labelled village.cni.io/lan=allowed that ask get one", c.Net.Name, netconf.PodsAll, netconf.PodsAnnotated)
}

// onKubernetes reports whether this node is a Kubernetes node: its registry
// is the Kubernetes API, or the agent runs in a pod.
func onKubernetes(c *Conf) bool {
	if r := c.Registry(); r != nil && r.Type == netconf.RegistryKubernetes {
		return true
	}
	return os.Getenv("KUBERNETES_SERVICE_HOST") != ""
}
