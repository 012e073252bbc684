package village

import (
	"encoding/json"
	"net/netip"
	"strings"

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
	if policyOn(a.args.StdinData) {
		if marked, err := table.MarkUntilReady("", a.conf.Name, ips); err != nil || marked {
			return err
		}
	}
	_, err := table.MarkNewPod("", a.conf.Name, cniArg(a.args.Args, "K8S_POD_NAMESPACE"), ips)
	return err
}

// policyOn reads the village entry's "networkPolicy" key from the
// plugin's stdin (the config was parsed before, so a bad value only
// leaves it off, as the agent then does).
func policyOn(stdin []byte) bool {
	var k struct {
		NetworkPolicy bool `json:"networkPolicy"`
	}
	_ = json.Unmarshal(stdin, &k)
	return k.NetworkPolicy
}

// cniArg is the value of key in CNI_ARGS ("K=V;K=V"), "" when absent.
func cniArg(args, key string) string {
	for _, kv := range strings.Split(args, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
