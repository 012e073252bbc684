package village

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/pluginexec"
)

// ipamCall execs the IPAM plugin for one interface. The main plugin runs it
// once for eth0 and (with a macvlan section) once more for the LAN
// interface, each with its own CNI_IFNAME and ipam block, so the two
// allocations are separate records.
type ipamCall struct {
	Type   string
	Args   *skel.CmdArgs
	IfName string // CNI_IFNAME for the IPAM plugin
	Conf   []byte // full stdin, with the ipam block this call is about
	// DHCPSocket, with the LAN IPAM type dhcp, is villaged's agent socket:
	// the verbs go there (op "dhcp") instead of to a plugin (dhcpVerb),
	// for Network.
	DHCPSocket string
	Network    string
}

// podIPAM is the call for the pod interface (CNI_IFNAME) with the
// runtime's config as it came.
func podIPAM(typ string, args *skel.CmdArgs) ipamCall {
	return ipamCall{Type: typ, Args: args, IfName: args.IfName, Conf: args.StdinData}
}

func (c ipamCall) path() (string, error) {
	p, err := pluginexec.Find(c.Type, c.Args.Path)
	if err != nil {
		return "", types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("IPAM plugin %q not found in CNI_PATH %q: install it next to village or fix \"ipam.type\"", c.Type, c.Args.Path), err.Error())
	}
	return p, nil
}

// exec is the plugin call of verb: the runtime's environment with this
// call's CNI_IFNAME, as the CNI spec has main plugins run IPAM.
//
// CNI_NETNS_OVERRIDE=1 spares the IPAM plugin skel's check that CNI_NETNS
// is not its own namespace: village made that check itself before it runs
// IPAM (netsetup.OpenPod refuses the plugin's namespace), and an IPAM plugin
// does not enter the namespace.
func (c ipamCall) exec(verb string) (pluginexec.Call, error) {
	p, err := c.path()
	if err != nil {
		return pluginexec.Call{}, err
	}
	return pluginexec.Call{Path: p, Command: verb, Stdin: c.Conf, Env: []string{
		"CNI_CONTAINERID=" + c.Args.ContainerID,
		"CNI_NETNS=" + c.Args.Netns,
		"CNI_IFNAME=" + c.IfName,
		"CNI_ARGS=" + ipamArgs(c.Args.Args),
		"CNI_PATH=" + c.Args.Path,
		"CNI_NETNS_OVERRIDE=1",
	}}, nil
}

// start forks the IPAM plugin for verb without its configuration (see
// pluginexec.Call.Start): it starts up while the caller finishes checking
// its input, then gets it by Send, or is Aborted having read nothing.
func (c ipamCall) start(verb string) (*pluginexec.Proc, error) {
	call, err := c.exec(verb)
	if err != nil {
		return nil, err
	}
	p, err := call.Start()
	if err != nil {
		return nil, wrapIPAM(c.Type, verb, err)
	}
	return p, nil
}

func (c ipamCall) run(ctx context.Context, verb string) error {
	if c.DHCPSocket != "" {
		return c.dhcpVerb(ctx, verb)
	}
	call, err := c.exec(verb)
	if err != nil {
		return err
	}
	if _, err := call.Run(ctx); err != nil {
		return wrapIPAM(c.Type, verb, err)
	}
	return nil
}

// Del, Check, Status and GC run the verb of the same name.
func (c ipamCall) Del(ctx context.Context) error    { return c.run(ctx, "DEL") }
func (c ipamCall) Check(ctx context.Context) error  { return c.run(ctx, "CHECK") }
func (c ipamCall) Status(ctx context.Context) error { return c.run(ctx, "STATUS") }
func (c ipamCall) GC(ctx context.Context) error     { return c.run(ctx, "GC") }

// wrapIPAM keeps the IPAM plugin's CNI error code (11 try again, 50 not
// available, …) and says which plugin and verb it came from.
func wrapIPAM(typ, verb string, err error) error {
	if e, ok := err.(*types.Error); ok {
		return types.NewError(e.Code, fmt.Sprintf("IPAM plugin %q %s: %s", typ, verb, e.Msg), e.Details)
	}
	return fmt.Errorf("IPAM plugin %q %s: %w", typ, verb, err)
}

// withIPAM returns stdin with its "ipam" key replaced by block: how the
// macvlan interface gets its own pool. The runtime's GC list names the
// attachments by CNI_IFNAME (eth0); the LAN allocations are recorded under
// ifName, so the list is rewritten to match them.
func withIPAM(stdin []byte, block json.RawMessage, ifName string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &m); err != nil {
		return nil, err
	}
	m["ipam"] = block
	for _, key := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		raw, ok := m[key]
		if !ok {
			continue
		}
		var list []map[string]any
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("failed to read %q: %w", key, err)
		}
		for _, a := range list {
			a["ifname"] = ifName
		}
		b, err := json.Marshal(list)
		if err != nil {
			return nil, err
		}
		m[key] = b
	}
	return json.Marshal(m)
}

func ipamTimeout() (context.Context, context.CancelFunc) {
	// The runtime has its own deadline; this one only guarantees that a hung
	// IPAM plugin cannot hold a pod's ADD forever.
	return context.WithTimeout(context.Background(), ipamDeadline)
}

// ipamCalls lists the IPAM calls of an attachment: eth0's, and the LAN
// interface's when the config has a macvlan section. DEL, CHECK, STATUS and
// GC run each of them.
func ipamCalls(conf *netconf.NetConf, args *skel.CmdArgs) ([]ipamCall, error) {
	var calls []ipamCall
	if conf.HasIPAM {
		calls = append(calls, podIPAM(conf.IPAMType, args))
	}
	if lanAttached(conf) {
		lan, err := lanIPAM(conf, args)
		if err != nil {
			return nil, err
		}
		calls = append(calls, lan)
	}
	return calls, nil
}

// lanIPAM is the call for the LAN interface: its own CNI_IFNAME and the
// macvlan section's ipam block.
func lanIPAM(conf *netconf.NetConf, args *skel.CmdArgs) (ipamCall, error) {
	lanConf, err := withIPAM(args.StdinData, conf.LAN.IPAM, conf.LAN.IfName)
	if err != nil {
		return ipamCall{}, fmt.Errorf("failed to build the LAN IPAM config: %w", err)
	}
	call := ipamCall{Type: conf.LAN.IPAMType, Args: args, IfName: conf.LAN.IfName, Conf: lanConf}
	if conf.LAN.IPAMType == netconf.LANDHCP {
		call.DHCPSocket, call.Network = agentSocket(conf.LAN), conf.Name
	}
	return call, nil
}
