package village

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/cleanup"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/pluginexec"
)

// Add is the CNI ADD verb.
func Add(args *skel.CmdArgs) (err error) {
	// The IPAM plugin's process start-up is the longest wait of an ADD, so
	// it is forked first and starts up while the config is parsed, the pod
	// namespace checked and the links made. It is given its input only once
	// that input is known to be good (startIPAM); until then it can claim
	// nothing, and it is killed if the input is bad.
	early := forkClaim(args)
	defer early.abort()
	conf, err := netconf.Parse(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if !conf.HasIPAM {
		return netconf.Error("\"ipam\" with a \"type\" is required: village needs addresses for the pod")
	}
	pod, err := netsetup.OpenPodCNI(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()

	var undo cleanup.Stack
	defer undo.RunIfFailed(&err)

	a := &adder{conf: conf, args: args, pod: pod, undo: &undo}
	if err := a.startIPAM(early); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// Registers the release of a claim still in flight (a failed
			// claim has nothing to release) and reaps the plugin.
			_ = a.awaitIPAM()
			_ = a.confirmIPAM()
		}
	}()
	result, err := a.run()
	if err != nil {
		return err
	}
	if conf.PrevResult != nil {
		if result, err = chain(conf.PrevResult, result); err != nil {
			return err
		}
	}
	return types.PrintResult(result, conf.CNIVersion)
}

// chain returns prevResult followed by this plugin's changes, with our
// interface indexes shifted past the previous plugins' interfaces.
func chain(prevRaw types.Result, ours *current.Result) (*current.Result, error) {
	prev, err := current.NewResultFromResult(prevRaw)
	if err != nil {
		return nil, fmt.Errorf("failed to read prevResult: %w", err)
	}
	shift := len(prev.Interfaces)
	prev.Interfaces = append(prev.Interfaces, ours.Interfaces...)
	for _, ipc := range ours.IPs {
		if ipc.Interface != nil {
			ipc.Interface = current.Int(*ipc.Interface + shift)
		}
		prev.IPs = append(prev.IPs, ipc)
	}
	prev.Routes = append(prev.Routes, ours.Routes...)
	if len(ours.DNS.Nameservers) > 0 || ours.DNS.Domain != "" {
		prev.DNS = ours.DNS
	}
	return prev, nil
}

// adder carries the state of one ADD between its steps.
type adder struct {
	conf *netconf.NetConf
	args *skel.CmdArgs
	pod  *netsetup.Pod
	undo *cleanup.Stack

	mtu     int // of the bridge and the pod's eth0 (netconf.PodMTU); 0: the kernel's default
	bridge  *netlink.Bridge
	veth    *netsetup.VethLinks
	result  *current.Result
	pending *pendingClaim // the IPAM ADD in flight, until confirmIPAM
}

// pendingClaim is an IPAM ADD running while the links are made.
type pendingClaim struct {
	call ipamCall
	proc *pluginexec.Proc
	live bool
	// cancel ends the deadline that kills the plugin; awaitIPAM sets it
	// when it reads the answer, confirmIPAM calls it once it is reaped.
	cancel context.CancelFunc
}

// forkClaim forks the IPAM plugin the config names for an ADD, without its
// input (see Add). It reads only "ipam.type"; nil when the config names no
// IPAM plugin or the plugin cannot be started: startIPAM then tries again
// and reports why, once the config has been checked.
func forkClaim(args *skel.CmdArgs) *pendingClaim {
	var peek struct {
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	if json.Unmarshal(args.StdinData, &peek) != nil || peek.IPAM.Type == "" {
		return nil
	}
	p, err := startClaim(podIPAM(peek.IPAM.Type, args))
	if err != nil {
		return nil
	}
	return p
}

// startClaim forks call's plugin for an ADD, without its input. The claim
// counts as live until checkLive has looked (see startIPAM).
func startClaim(call ipamCall) (*pendingClaim, error) {
	proc, err := call.start("ADD")
	if err != nil {
		return nil, err
	}
	return &pendingClaim{call: call, proc: proc, live: true}, nil
}

// abort kills a claim that was never sent its input (and reaps one that
// was): what a failed ADD does with a plugin it forked but did not wait for.
func (p *pendingClaim) abort() {
	if p != nil {
		p.proc.Abort()
	}
}

// run makes the attachment while the IPAM plugin (started by Add) claims
// the addresses: the bridge and the veth do not need them.
func (a *adder) run() (*current.Result, error) {
	steps := []func() error{a.checkLive, a.ensureOverlay, a.ensureBridge, a.ensureVeth, a.awaitIPAM, a.describeLinks, a.ensureSpoofCheck, a.configurePod, a.configureHost, a.addLAN, a.confirmIPAM}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return a.result, nil
}

func (a *adder) ensureBridge() error {
	br, err := netsetup.EnsureBridge(netsetup.Bridge{
		Name:          a.conf.Bridge,
		MTU:           a.mtu,
		Promisc:       a.conf.PromiscMode,
		VlanFiltering: a.conf.Vlan > 0,
	})
	if err != nil {
		return err
	}
	a.bridge = br
	return nil
}

// startIPAM gives the IPAM plugin forked by forkClaim its input (or forks
// it now, if forkClaim could not), so that it claims the addresses while
// the links are made; awaitIPAM collects them. Until checkLive has looked,
// the claim counts as live: a failure before then leaves the addresses to
// the runtime's DEL rather than risk taking them from a pod that holds them.
func (a *adder) startIPAM(early *pendingClaim) error {
	p := early
	if p == nil || p.call.Type != a.conf.IPAMType {
		early.abort()
		var err error
		if p, err = startClaim(podIPAM(a.conf.IPAMType, a.args)); err != nil {
			return err
		}
	}
	p.proc.Send()
	a.pending = p
	return nil
}

// checkLive records whether this ADD retries an attachment that lives (see
// live), before any link of this ADD exists.
func (a *adder) checkLive() error {
	live, err := a.live(a.args.IfName, netsetup.HostVethName(a.args.ContainerID, a.args.IfName))
	if err != nil {
		return err
	}
	a.pending.live = live // startIPAM ran before the steps
	return nil
}

// awaitIPAM waits for the answer of the claim startIPAM started, registers
// its release on the undo stack and takes its result. The IPAM process may
// still be exiting: confirmIPAM, the last step, waits for its exit status
// before the result can be reported. Calling it again does nothing.
func (a *adder) awaitIPAM() error {
	p := a.pending
	if p == nil || p.cancel != nil {
		return nil
	}
	warmResultCodec(a.conf.CNIVersion)
	ctx, cancel := ipamTimeout()
	p.cancel = cancel
	res, err := p.call.answer(ctx, p.proc)
	if err != nil {
		a.pending = nil
		cancel() // answer reaped it
		return err
	}
	a.pushRelease(p.live, fmt.Sprintf("release addresses of %q through IPAM %q", a.args.IfName, p.call.Type), p.call)
	a.result = res
	a.fillGateways()
	return nil
}

// confirmIPAM reaps the IPAM process whose answer awaitIPAM took (it always
// runs after awaitIPAM, which set p.cancel): the ADD fails (and undoes what
// it made with those addresses) unless it exited 0.
func (a *adder) confirmIPAM() error {
	p := a.pending
	if p == nil {
		return nil
	}
	a.pending = nil
	err := p.call.confirm(p.proc)
	p.cancel()
	return err
}

// warmResultCodec decodes and encodes a result of the network's version
// once, while the IPAM plugin is still working: the first use of
// encoding/json on a type builds its field cache and touches the decoder's
// and encoder's code for the first time (page faults), about half a
// millisecond that otherwise sits between the IPAM plugin's answer and the
// pod's configuration, and again before the result is printed.
func warmResultCodec(cniVersion string) {
	r, err := create.Create(cniVersion, []byte(warmResult))
	if err != nil {
		return
	}
	if cur, err := current.NewResultFromResult(r); err == nil {
		if v, err := cur.GetAsVersion(cniVersion); err == nil {
			_, _ = json.Marshal(v)
		}
	}
}

const warmResult = `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"02:00:00:00:00:01","sandbox":"/x"}],` +
	`"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1","interface":0},{"address":"fd00::2/64","gateway":"fd00::1"}],` +
	`"routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1"}],"dns":{"nameservers":["10.0.0.10"],"search":["a"]}}`

// live reports whether a previous ADD of this container made the pod
// interface ifName (its owner tag is there): this ADD is then a retry of an
// attachment that lives, and the IPAM plugin hands back the addresses it
// already holds.
func (a *adder) live(ifName, hostName string) (bool, error) {
	l, err := a.pod.OwnedLink(ifName, a.args.ContainerID, hostName)
	return l != nil, err
}

// pushRelease registers the IPAM DEL that undoes a failed ADD, unless the
// addresses belong to a live attachment: a failed retry must not take them
// from the pod that holds them.
func (a *adder) pushRelease(live bool, what string, call ipamCall) {
	if live {
		return
	}
	a.undo.Push(what, func() error {
		ctx, cancel := ipamTimeout()
		defer cancel()
		return call.Del(ctx)
	})
}

// fillGateways gives every address the gateway the reference bridge would
// (the subnet's first address when IPAM names none and isGateway is set)
// and adds the default routes isDefaultGateway asks for.
func (a *adder) fillGateways() {
	isGW := a.conf.IsGateway || a.conf.IsDefaultGW
	for _, ipc := range a.result.IPs {
		if ipc.Gateway == nil && isGW {
			ipc.Gateway = cidr.FirstHost(&ipc.Address)
		}
	}
	if !a.conf.IsDefaultGW {
		return
	}
	for _, ipc := range a.result.IPs {
		if ipc.Gateway == nil {
			continue
		}
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if ipc.Address.IP.To4() == nil {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		if !hasRoute(a.result.Routes, dst) {
			a.result.Routes = append(a.result.Routes, &types.Route{Dst: *dst, GW: ipc.Gateway})
		}
	}
}

func hasRoute(routes []*types.Route, dst *net.IPNet) bool {
	for _, r := range routes {
		if r.Dst.String() == dst.String() {
			return true
		}
	}
	return false
}

func (a *adder) ensureVeth() error {
	links, err := netsetup.EnsureVeth(netsetup.Veth{
		ContainerID: a.args.ContainerID,
		IfName:      a.args.IfName,
		Pod:         a.pod,
		Bridge:      a.bridge,
		MTU:         a.mtu,
		MAC:         a.conf.MAC,
		Hairpin:     a.conf.Hairpin,
		Vlan:        a.conf.Vlan,
		// The reference removes VLAN 1 from a port "vlan" moves elsewhere.
		PreserveDefaultVlan: a.conf.PreserveDefaultVlan,
		Isolated:            a.conf.PortIsolation,
	})
	if err != nil {
		return err
	}
	a.veth = links
	if links.Created {
		hostName := links.Host.Attrs().Name
		a.undo.Push(fmt.Sprintf("delete veth %q", hostName), func() error {
			return netsetup.DeleteHostLink(hostName)
		})
	}
	return nil
}

// describeLinks puts the bridge, the host veth and the pod interface into
// the result, the addresses on the pod interface.
func (a *adder) describeLinks() error {
	links := a.veth
	a.result.Interfaces = []*current.Interface{
		{Name: a.bridge.Attrs().Name, Mac: a.bridge.Attrs().HardwareAddr.String()},
		{Name: links.Host.Attrs().Name, Mac: links.Host.Attrs().HardwareAddr.String()},
		{Name: a.args.IfName, Mac: links.Pod.Attrs().HardwareAddr.String(), Mtu: links.Pod.Attrs().MTU, Sandbox: a.args.Netns},
	}
	for _, ipc := range a.result.IPs {
		ipc.Interface = current.Int(2)
	}
	return nil
}

// ensureSpoofCheck drops frames the pod sends with a source MAC other than
// its interface's (macspoofchk).
func (a *adder) ensureSpoofCheck() error {
	if !a.conf.MacSpoofChk {
		return nil
	}
	sc := spoofCheck(a.conf, a.veth.Host.Attrs().Name, a.veth.Pod.Attrs().HardwareAddr)
	if err := masq.EnsureSpoofCheck(sc); err != nil {
		return err
	}
	a.undo.Push(fmt.Sprintf("delete macspoofchk rule of %q", sc.HostVeth), func() error {
		return masq.DeleteSpoofCheck(sc.Network, sc.HostVeth)
	})
	return nil
}

func spoofCheck(conf *netconf.NetConf, hostVeth string, mac net.HardwareAddr) masq.SpoofCheck {
	return masq.SpoofCheck{Network: conf.Name, HostVeth: hostVeth, MAC: mac}
}

func (a *adder) configurePod() error {
	return a.pod.ConfigurePod(podIface(a.veth.Pod, a.result, a.result.IPs))
}

// podIface turns IPAM's answer into the pod-side configuration of one
// interface: its addresses, and the result's routes via the gateway of the
// route's family.
func podIface(link netlink.Link, res *current.Result, ips []*current.IPConfig) netsetup.PodIface {
	c := netsetup.PodIface{Link: link}
	gw := map[bool]net.IP{}
	for _, ipc := range ips {
		addr := ipc.Address
		c.Addrs = append(c.Addrs, netsetup.PodAddr{Addr: &addr})
		v4 := ipc.Address.IP.To4() != nil
		if gw[v4] == nil && ipc.Gateway != nil {
			gw[v4] = ipc.Gateway
		}
	}
	for _, r := range res.Routes {
		dst := r.Dst
		v4 := dst.IP.To4() != nil
		if _, ok := familyHas(ips, v4); !ok {
			continue
		}
		via := r.GW
		if via == nil {
			via = gw[v4]
		}
		mtu := 0
		if r.MTU != 0 {
			mtu = r.MTU
		}
		c.Routes = append(c.Routes, netsetup.PodRoute{Dst: &dst, GW: via, MTU: mtu})
	}
	return c
}

func familyHas(ips []*current.IPConfig, v4 bool) (*current.IPConfig, bool) {
	for _, ipc := range ips {
		if (ipc.Address.IP.To4() != nil) == v4 {
			return ipc, true
		}
	}
	return nil, false
}

// configureHost ensures the node side: gateway addresses on the bridge, IP
// forwarding, and the network's masquerade rule set.
func (a *adder) configureHost() error {
	var addrs []net.IP
	for _, ipc := range a.result.IPs {
		addrs = append(addrs, ipc.Address.IP)
		if ipc.Gateway == nil || !(a.conf.IsGateway || a.conf.IsDefaultGW) {
			continue
		}
		gw := &net.IPNet{IP: ipc.Gateway, Mask: ipc.Address.Mask}
		if err := netsetup.EnsureGateway(a.bridge, netsetup.GatewaySpec{Addr: gw, Force: a.conf.ForceAddress}); err != nil {
			return err
		}
	}
	if a.conf.IsGateway || a.conf.IsDefaultGW || a.conf.IPMasq {
		if err := netsetup.EnableForwarding(addrs); err != nil {
			return err
		}
	}
	if a.conf.IPMasq || a.conf.ForwardAccept || a.conf.MacSpoofChk {
		return ensureNetfilter(a.conf, a.bridge, masqSpec(a.conf, a.result.IPs))
	}
	return nil
}

// masqSpec is the netfilter state the network wants on this node.
func masqSpec(conf *netconf.NetConf, ips []*current.IPConfig) masq.Spec {
	var subnets []*net.IPNet
	for _, ipc := range ips {
		subnets = append(subnets, cidr.Network(&ipc.Address))
	}
	return conf.PodNetfilter(subnets)
}

// ensureNetfilter keeps the network's netfilter rules in place at the cost of
// one nf_tables generation read when nothing changed: the bridge's ifalias
// records, per network, the spec's stamp and the netfilter fingerprint seen
// when the rules were last found complete (see masq.Sync). A flush by a
// firewall reload or an admin moves the fingerprint, so this ADD looks
// again and puts the rules back. The stamp is per node namespace and
// disappears with the bridge.
//
// When the fingerprint moved and macspoofchk is on, the rules of every pod
// of the bridge are checked too (their MACs are recorded under
// masq.SpoofDir) and put back when a flush took them.
func ensureNetfilter(conf *netconf.NetConf, br *netlink.Bridge, spec masq.Spec) error {
	alias := br.Attrs().Alias
	prev := masq.FindStamp(alias, masq.StampNetwork(spec.Stamp()))
	res, err := masq.Sync(spec, prev)
	if err != nil {
		return err
	}
	if res.Stamp == prev {
		return nil
	}
	if res.Repaired != "" {
		fmt.Fprintf(os.Stderr, "village: netfilter rules of network %q were changed behind Village's back, restored: %s\n", spec.Network, res.Repaired)
	}
	if conf.MacSpoofChk {
		restored, err := masq.RestoreSpoofChecks(conf.Name, br.Index)
		if err != nil {
			return err
		}
		if len(restored) > 0 {
			fmt.Fprintf(os.Stderr, "village: macspoofchk rules of %v (network %q) were gone, restored\n", restored, conf.Name)
		}
	}
	if err := netlink.LinkSetAlias(br, masq.SetStamp(alias, res.Stamp)); err != nil {
		return fmt.Errorf("failed to record masquerade stamp on bridge %q: %w", br.Attrs().Name, err)
	}
	return nil
}
