package village

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/cleanup"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/validate"
)

// Add is the CNI ADD verb.
func Add(args *skel.CmdArgs) (err error) {
	a := &adder{args: args}
	defer a.closePod() // after the rollback, which may delete links inside the pod
	defer a.undo.RunIfFailed(&err)
	// The IPAM plugin's start-up is the longest wait of an ADD: it is forked
	// before anything else and given its input in sendClaims.
	t := time.Now()
	a.pod0 = forkEarly(args, &a.undo)
	cnilog.Step("fork", t)
	if a.conf, err = netconf.Parse(args.StdinData, args.Args); err != nil {
		return err
	}
	if !a.conf.HasIPAM {
		return netconf.Error("\"ipam\" with a \"type\" is required: village needs addresses for the pod")
	}
	// skel checked CNI_IFNAME with CNI's rule; the shared rule also refuses
	// the control bytes the IPAM store would refuse after the links exist.
	if err := validate.LinkName(args.IfName); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_IFNAME: %v", err), "")
	}
	t = time.Now()
	if a.pod, err = netsetup.OpenPodCNI(args.Netns); err != nil {
		return err
	}
	cnilog.Step("netns", t)
	t = time.Now()
	if err := a.sendClaims(); err != nil {
		return err
	}
	cnilog.Step("send", t)
	result, err := a.run()
	if err != nil {
		if a.lanFailed {
			a.reportLANFailure(err)
		}
		return err
	}
	a.reportLANResult(result)
	if a.conf.PrevResult != nil {
		if result, err = chain(a.conf.PrevResult, result); err != nil {
			return err
		}
	}
	defer cnilog.Step("print", time.Now())
	return types.PrintResult(result, a.conf.CNIVersion)
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
	undo cleanup.Stack

	pod0 *claim     // the addresses of CNI_IFNAME
	lan  *claim     // the LAN interface's, with a macvlan section the pod gets
	dhcp *dhcpClaim // instead of lan, with macvlan.ipam type dhcp

	askedAgent bool // the LAN request came from the node's agent (lanpods.go)
	lanFailed  bool // the ADD failed on the LAN interface

	mtu       int // of the bridge and the pod's eth0 (netconf.PodMTU); 0: the kernel's default
	bridge    *netlink.Bridge
	veth      *netsetup.VethLinks
	lanMaster netlink.Link
	result    *current.Result
}

func (a *adder) closePod() {
	if a.pod != nil {
		a.pod.Close()
	}
}

// forkEarly forks the IPAM plugin the config names for the pod interface,
// before the config is parsed: it reads only "ipam.type". It is nil when the
// config names no IPAM plugin or the plugin cannot be started; sendClaims
// then tries again and reports why, once the config has been checked.
func forkEarly(args *skel.CmdArgs, undo *cleanup.Stack) *claim {
	var peek struct {
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	if json.Unmarshal(args.StdinData, &peek) != nil || peek.IPAM.Type == "" {
		return nil
	}
	c, err := forkClaim(podIPAM(peek.IPAM.Type, args), undo)
	if err != nil {
		return nil
	}
	return c
}

// sendClaims gives the IPAM plugins their input once the config, the pod
// namespace and the LAN section passed their checks: the pod interface's
// (forked again if forkEarly could not, or forked another plugin than the
// parsed config names) and the LAN interface's, forked here. Both claim
// their addresses while the links are made. Every fork comes before the
// first send, so a failure here leaves no claim that read its input. Until
// checkLive has looked, the claims count as live (see claim.live).
func (a *adder) sendClaims() error {
	if lan := a.conf.LAN; lan != nil {
		if lan.IfName == a.args.IfName {
			return netconf.Error("\"macvlan.ifName\" %q is the same as CNI_IFNAME: pick another name for the LAN interface", lan.IfName)
		}
		req, err := a.lanRequest()
		if err != nil {
			return err
		}
		if !req.Want {
			return a.sendPodClaim()
		}
		master, err := macvlan.ResolveMaster(lan.Master)
		if err != nil {
			return err
		}
		call, err := lanIPAM(a.conf, a.args)
		if err != nil {
			return err
		}
		if call.Conf, err = withRequestedIPs(call.Conf, req.IPs); err != nil {
			return fmt.Errorf("failed to build the LAN IPAM config: %w", err)
		}
		a.lanMaster = master
		if lan.IPAMType == netconf.LANDHCP {
			a.dhcp = newDHCPClaim(a.conf, a.args)
		} else if a.lan, err = forkClaim(call, &a.undo); err != nil {
			return fmt.Errorf("LAN interface %q: %w", lan.IfName, err)
		}
	}
	return a.sendPodClaim()
}

// sendPodClaim forks the pod interface's IPAM plugin when forkEarly did not
// fork the right one, then sends both claims their input.
func (a *adder) sendPodClaim() error {
	if a.pod0 == nil || a.pod0.call.Type != a.conf.IPAMType {
		a.pod0.abort()
		var err error
		if a.pod0, err = forkClaim(podIPAM(a.conf.IPAMType, a.args), &a.undo); err != nil {
			return err
		}
	}
	a.pod0.send()
	if a.lan != nil {
		a.lan.send()
	}
	return nil
}

// run makes the attachment while the IPAM plugins claim the addresses: the
// bridge and the veth do not need them. Each step's time goes to the
// plugin's log (cnilog.Step) under its name; "ipam" is the wait for the
// IPAM plugin's answer, "reap" for its exit.
func (a *adder) run() (*current.Result, error) {
	type step struct {
		name string
		do   func() error
	}
	links := []step{{"overlay", a.ensureOverlay}, {"bridge", a.ensureBridge}, {"veth", a.ensureVeth}, {"ipam", a.podAddresses}}
	if a.conf.Overlay.Routes() {
		// the overlay's routes and MTU follow the pod's addresses: with
		// overlay routes the wait for them comes first (and is logged as
		// "ipam", not inside "overlay")
		links = []step{{"ipam", a.podAddresses}, {"overlay", a.ensureOverlay}, {"bridge", a.ensureBridge}, {"veth", a.ensureVeth}}
	}
	steps := append([]step{{"live", a.checkLive}}, links...)
	steps = append(steps, []step{{"describe", a.describeLinks}, {"spoofcheck", a.ensureSpoofCheck},
		{"pod", a.configurePod}, {"policy", a.markPolicyPending}, {"host", a.configureHost},
		{"lan", a.addLAN}, {"reap", a.waitClaims}}...)
	for _, s := range steps {
		t := time.Now()
		err := s.do()
		cnilog.Step(s.name, t)
		if err != nil {
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

// checkLive records, before any link of this ADD exists, whether the ADD
// retries an attachment that lives (see claim.live).
func (a *adder) checkLive() error {
	if err := a.markLive(a.pod0, netsetup.HostVethName(a.args.ContainerID, a.args.IfName)); err != nil {
		return err
	}
	if a.lan != nil {
		return a.markLive(a.lan, "")
	}
	if a.dhcp != nil {
		return a.dhcp.markLive(a)
	}
	return nil
}

// markLive sets c.live: a previous ADD of this container made c's
// interface (its owner tag is there, and on its host end hostName, if
// any), so the IPAM plugin hands back the addresses it already holds.
func (a *adder) markLive(c *claim, hostName string) error {
	l, err := a.pod.OwnedLink(c.call.IfName, a.args.ContainerID, hostName)
	if err != nil {
		return err // c stays live: the failed ADD releases nothing
	}
	c.live = l != nil
	return nil
}

// podAddresses takes the pod interface's addresses from its claim, the
// first time it is called (ensureOverlay may need them before the links).
func (a *adder) podAddresses() error {
	if a.result != nil {
		return nil
	}
	warmResultCodec(a.conf.CNIVersion)
	res, err := a.pod0.answer()
	if err != nil {
		return err
	}
	a.result = res
	a.fillGateways()
	return nil
}

// waitClaims reaps the IPAM plugins whose answers the ADD used: it fails
// (and is undone, its addresses released) unless each exited 0.
func (a *adder) waitClaims() error {
	if err := a.pod0.wait(); err != nil {
		return err
	}
	if a.lan != nil {
		if err := a.lan.wait(); err != nil {
			a.lanFailed = true
			return fmt.Errorf("LAN interface %q: %w", a.conf.LAN.IfName, err)
		}
	}
	return nil
}

// warmResultCodec decodes and encodes a result of the network's version
// once while the IPAM plugin works, so encoding/json's first use of the
// result types is not between its answer and the pod's configuration (see
// docs/performance.md, third round).
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
// its interface's (macspoofchk), and with networkPolicy on packets with a
// source address other than its own (the policy decides by it).
func (a *adder) ensureSpoofCheck() error {
	if !spoofChecked(a.conf) {
		return nil
	}
	var ips []netip.Addr
	for _, ipc := range a.result.IPs {
		if ip, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			ips = append(ips, ip.Unmap())
		}
	}
	sc := spoofCheck(a.conf, a.veth.Host.Attrs().Name, a.veth.Pod.Attrs().HardwareAddr, ips)
	if err := masq.EnsureSpoofCheck(sc); err != nil {
		return err
	}
	a.undo.Push(fmt.Sprintf("delete macspoofchk rule of %q", sc.HostVeth), func() error {
		return masq.DeleteSpoofCheck(sc)
	})
	return nil
}

// spoofChecked says the network's pod ports have source checks.
func spoofChecked(conf *netconf.NetConf) bool { return conf.MacSpoofChk || conf.NetworkPolicy }

// spoofCheck is a pod port's source check: its MAC with macspoofchk, its
// addresses with networkPolicy.
func spoofCheck(conf *netconf.NetConf, hostVeth string, mac net.HardwareAddr, ips []netip.Addr) masq.SpoofCheck {
	sc := masq.SpoofCheck{Network: conf.Name, HostVeth: hostVeth, Bridge: conf.Bridge}
	if conf.MacSpoofChk {
		sc.MAC = mac
	}
	if conf.NetworkPolicy {
		sc.IPs = ips
	}
	return sc
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
		if !familyHas(ips, v4) {
			continue
		}
		via := r.GW
		if via == nil {
			via = gw[v4]
		}
		c.Routes = append(c.Routes, netsetup.PodRoute{Dst: &dst, GW: via, MTU: r.MTU})
	}
	return c
}

// familyHas reports whether ips has an address of the family (IPv4 when v4).
func familyHas(ips []*current.IPConfig, v4 bool) bool {
	for _, ipc := range ips {
		if (ipc.Address.IP.To4() != nil) == v4 {
			return true
		}
	}
	return false
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
	return keepNetfilter(a.conf, a.result.IPs)
}

// keepNetfilter keeps the network's netfilter rules in place (masq.Keep)
// at the cost of one nf_tables generation read when nothing changed: the
// bridge's ifalias records the spec's stamp and the netfilter fingerprint
// seen when the rules were last found complete. A flush by a firewall
// reload or an admin moves the fingerprint, so this ADD looks again and
// puts the rules back, the macspoofchk rules of every pod of the bridge
// too.
func keepNetfilter(conf *netconf.NetConf, ips []*current.IPConfig) error {
	res, err := masq.Keep(conf.Netfilter(podSubnets(ips)), masq.Node{Bridge: conf.Bridge})
	if err != nil {
		return err
	}
	if res.Repaired != "" {
		fmt.Fprintf(os.Stderr, "village: netfilter rules of network %q were changed behind Village's back, restored: %s\n", conf.Name, res.Repaired)
	}
	if len(res.SpoofRestored) > 0 {
		fmt.Fprintf(os.Stderr, "village: macspoofchk rules of %v (network %q) were gone, restored\n", res.SpoofRestored, conf.Name)
	}
	return nil
}
