package village

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// village-ipam's error codes for an exhausted range set and a requested
// address it cannot grant (pkg/ipam/plugin.ErrCodeExhausted and
// ErrCodeAddressUnavailable; the plugin does not link village-ipam).
const (
	ipamExhausted          = 100
	ipamAddressUnavailable = 101
	// ipamDetailOutsidePool is the details of an ipamAddressUnavailable
	// error for an address in no range (plugin.DetailOutsidePool).
	ipamDetailOutsidePool = "outside-pool"
)

// agentAskTimeout bounds a LAN lookup: the agent's own bounded wait for a
// pod it has not seen yet (agent.lanWait) with room to spare.
const agentAskTimeout = 25 * time.Second

// agentReportTimeout bounds the report after the ADD: it is best effort
// (the agent answers at once and writes to the API on its own time).
const agentReportTimeout = 3 * time.Second

// agentSocket is the node agent's socket: the LAN's "daemonSocketPath"
// with its IPAM type dhcp when it names one, else
// $VILLAGE_RUN_DIR/agent.sock (the agent serves the same, Conf.agentSocket).
func agentSocket(lan *netconf.LAN) string {
	if lan != nil && lan.IPAMType == netconf.LANDHCP && lan.DHCPSocket != "" {
		return lan.DHCPSocket
	}
	return agentsock.Path("")
}

// lanRequest decides whether this pod gets the LAN interface, and with
// which exact addresses:
//   - pods "all": every pod, at the addresses CNI_ARGS VILLAGE_LAN_IP names
//     (none: the pool picks);
//   - pods "annotated" for a Kubernetes pod (CNI_ARGS K8S_POD_*): what its
//     annotations ask, learnt from the node's agent, which also refuses
//     the pods of namespaces not allowed;
//   - pods "annotated" otherwise: what CNI_ARGS VILLAGE_LAN and
//     VILLAGE_LAN_IP ask.
//
// Requested addresses are checked against the pool here, so the refusal
// names the pool before any IPAM plugin runs.
func (a *adder) lanRequest() (netconf.LANRequest, error) {
	lan := a.conf.LAN
	var req netconf.LANRequest
	switch {
	case lan.Pods == netconf.PodsAll:
		req = netconf.LANRequest{Want: true, IPs: a.conf.LANArgs.IPs}
	case a.conf.Pod.IsSet():
		if err := a.conf.Pod.Check(); err != nil {
			return req, err
		}
		a.askedAgent = true
		var err error
		if req, err = askAgent(agentSocket(lan), a.conf.Name, a.pod0Ref()); err != nil {
			return req, err
		}
	default:
		req = a.conf.LANArgs
	}
	if err := lan.CheckAddrs(req.IPs); err != nil {
		a.reportLAN(agentsock.Report{Failure: agentsock.FailOutsidePool, Message: err.Error()})
		return req, types.NewError(ipamAddressUnavailable, fmt.Sprintf("LAN interface %q: %v", lan.IfName, err), ipamDetailOutsidePool)
	}
	return req, nil
}

func (a *adder) pod0Ref() agentsock.Pod {
	p := a.conf.Pod
	return agentsock.Pod{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// askAgent asks the node's agent what the pod's annotations say about the
// LAN. An agent not (yet) answering on its socket is waited for, within
// nodelocal.AgentWait (after a reboot the runtime sends ADDs before
// villaged is back); past that bound, or for a pod the agent has not seen
// yet, the error is CNI code 11 (try again later): kubelet retries the
// sandbox.
func askAgent(path, network string, pod agentsock.Pod) (netconf.LANRequest, error) {
	bound, err := agentWait()
	if err != nil {
		return netconf.LANRequest{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound+agentAskTimeout)
	defer cancel()
	resp, err := agentsock.AskWaiting(ctx, path, agentsock.Request{Op: agentsock.OpLANPod, Network: network, Pod: &pod}, bound)
	if err != nil {
		code := uint(types.ErrInvalidNetworkConfig)
		var ae *agentsock.Error
		if errors.As(err, &ae) && ae.Retry {
			code = types.ErrTryAgainLater
		}
		return netconf.LANRequest{}, types.NewError(code, fmt.Sprintf("\"macvlan.pods\" is %q, so the LAN interface of pod %s depends on its annotations: %v", netconf.PodsAnnotated, pod, err), "")
	}
	if resp.LAN == nil {
		return netconf.LANRequest{}, nil
	}
	req := netconf.LANRequest{Want: resp.LAN.Want}
	if len(resp.LAN.IPs) > 0 {
		ips, err := netconf.ParseLANAddrs(strings.Join(resp.LAN.IPs, ","))
		if err != nil {
			return req, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("pod %s: %s: %v", pod, kubenames.AnnotationLANIP, err), "")
		}
		req.Want, req.IPs = true, ips
	}
	return req, nil
}

// agentWait is how long a Kubernetes pod's ADD waits for the node's agent
// to answer on its socket (nodelocal.AgentWait), for its annotated LAN ask
// and its DHCP lease alike; a bad $VILLAGE_AGENT_WAIT is CNI code 4.
func agentWait() (time.Duration, error) {
	bound, err := nodelocal.AgentWait()
	if err != nil {
		return 0, types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	return bound, nil
}

// reportLAN tells the agent what happened to a Kubernetes pod's LAN
// interface (the agent writes the annotation or an Event). Best effort:
// the ADD's outcome does not depend on it; a failure is logged.
func (a *adder) reportLAN(r agentsock.Report) {
	if !a.askedAgent {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), agentReportTimeout)
	defer cancel()
	pod := a.pod0Ref()
	if _, err := agentsock.Ask(ctx, agentSocket(a.conf.LAN), agentsock.Request{Op: agentsock.OpLANReport, Network: a.conf.Name, Pod: &pod, Report: &r}); err != nil {
		fmt.Fprintf(os.Stderr, "village: reporting the LAN interface of pod %s to the agent: %v\n", pod, err)
	}
}

// reportLANResult reports the LAN addresses of a successful ADD.
func (a *adder) reportLANResult(res *current.Result) {
	if !a.askedAgent || (a.lan == nil && a.dhcp == nil) || res == nil {
		return
	}
	idx := -1
	for i, ifc := range res.Interfaces {
		if ifc.Name == a.conf.LAN.IfName && ifc.Sandbox != "" {
			idx = i
		}
	}
	var addrs []string
	for _, ipc := range res.IPs {
		if ipc.Interface != nil && *ipc.Interface == idx {
			addrs = append(addrs, ipc.Address.String())
		}
	}
	a.reportLAN(agentsock.Report{IfName: a.conf.LAN.IfName, Addresses: addrs})
}

// reportLANFailure reports why the LAN part of an ADD failed, by the IPAM
// plugin's error code.
func (a *adder) reportLANFailure(err error) {
	if !a.askedAgent || err == nil {
		return
	}
	a.reportLAN(agentsock.Report{Failure: lanFailure(err), Message: err.Error()})
}

// lanFailure is the reason of a failed LAN IPAM call, from the IPAM
// plugin's error code and details (never its message).
func lanFailure(err error) string {
	var te *types.Error
	if !errors.As(err, &te) {
		return agentsock.FailOther
	}
	switch {
	case te.Code == ipamExhausted:
		return agentsock.FailExhausted
	case te.Code == ipamAddressUnavailable && te.Details == ipamDetailOutsidePool:
		return agentsock.FailOutsidePool
	case te.Code == ipamAddressUnavailable:
		return agentsock.FailTaken
	}
	return agentsock.FailOther
}

// withRequestedIPs puts ips into the LAN IPAM call's stdin as args.cni.ips
// (the CNI "ips" convention every host-local-compatible IPAM reads),
// replacing what the runtime put there for the pod interface.
func withRequestedIPs(stdin []byte, ips []netip.Addr) ([]byte, error) {
	if len(ips) == 0 {
		return stdin, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &m); err != nil {
		return nil, err
	}
	args := map[string]json.RawMessage{}
	if raw, ok := m["args"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &args); err != nil {
			return nil, fmt.Errorf("failed to read \"args\": %w", err)
		}
	}
	cni := map[string]json.RawMessage{}
	if raw, ok := args["cni"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &cni); err != nil {
			return nil, fmt.Errorf("failed to read \"args.cni\": %w", err)
		}
	}
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	var err error
	if cni["ips"], err = json.Marshal(s); err != nil {
		return nil, err
	}
	if args["cni"], err = json.Marshal(cni); err != nil {
		return nil, err
	}
	if m["args"], err = json.Marshal(args); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// lanAttached says whether DEL and CHECK should handle the LAN interface:
// always with pods "all"; with pods "annotated" unless the prevResult the
// runtime kept shows the ADD made none (without a prevResult, DEL
// releases anyway: releasing nothing is fine).
func lanAttached(conf *netconf.NetConf) bool {
	if conf.LAN == nil {
		return false
	}
	if conf.LAN.Pods != netconf.PodsAnnotated || conf.PrevResult == nil {
		return true
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return true
	}
	for _, ifc := range prev.Interfaces {
		if ifc.Name == conf.LAN.IfName && ifc.Sandbox != "" {
			return true
		}
	}
	return false
}

// villageArgs are the CNI_ARGS keys only village reads; they are taken out
// of what the IPAM plugins get (host-local and village-ipam refuse unknown
// keys unless IgnoreUnknown is set).
var villageArgs = []string{"VILLAGE_LAN=", "VILLAGE_LAN_IP="}

// ipamArgs is CNI_ARGS without villageArgs.
func ipamArgs(cniArgs string) string {
	if !strings.Contains(cniArgs, "VILLAGE_LAN") {
		return cniArgs
	}
	var keep []string
	for _, kv := range strings.Split(cniArgs, ";") {
		drop := false
		for _, p := range villageArgs {
			if strings.HasPrefix(kv, p) {
				drop = true
			}
		}
		if !drop {
			keep = append(keep, kv)
		}
	}
	return strings.Join(keep, ";")
}
