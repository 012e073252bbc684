package village

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/overlay"
)

// Check is the CNI CHECK verb: it compares what the kernel has with the
// prevResult and names every piece that drifted. It writes nothing: what it
// reports on the node is repaired by the next ADD and by villaged, what it
// reports in the pod by re-creating the pod.
func Check(args *skel.CmdArgs) error {
	conf, calls, err := load(args)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return netconf.Error("CHECK needs \"prevResult\": the result of the ADD it checks")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return fmt.Errorf("failed to read prevResult: %w", err)
	}
	ctx, cancel := ipamTimeout()
	defer cancel()
	for _, call := range calls {
		if err := call.Check(ctx); err != nil {
			return err
		}
	}
	pod, err := netsetup.OpenPodCNI(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()

	var d drift
	d.pod = append(d.pod, checkPod(pod, podCheck{ifName: args.IfName, kind: "veth"}, prev)...)
	if lanAttached(conf) {
		d.pod = append(d.pod, checkPod(pod, podCheck{ifName: conf.LAN.IfName, kind: "macvlan"}, prev)...)
	}
	d.pod = append(d.pod, checkRoutes(pod, prev)...)
	d.node = append(d.node, checkHost(conf, args, prev)...)
	d.netfilter = checkNetfilter(conf, args, prev)
	d.peers = checkPeers(conf, ipsOf(prev, podIfaceIndex(prev, args.IfName)))
	return d.asError(args)
}

// checkNetfilter reports the network's netfilter rules that are missing:
// the masquerade and forward rules, and this pod's macspoofchk rule.
func checkNetfilter(conf *netconf.NetConf, args *skel.CmdArgs, prev *current.Result) []error {
	idx := podIfaceIndex(prev, args.IfName)
	var ports []masq.SpoofCheck
	if spoofChecked(conf) && idx >= 0 {
		mac, err := net.ParseMAC(prev.Interfaces[idx].Mac)
		if err == nil || !conf.MacSpoofChk {
			var ips []netip.Addr
			for _, ipc := range ipsOf(prev, idx) {
				if ip, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
					ips = append(ips, ip.Unmap())
				}
			}
			ports = append(ports, spoofCheck(conf, netsetup.HostVethName(args.ContainerID, args.IfName), mac, ips))
		}
	}
	if err := masq.Check(conf.Netfilter(podSubnets(ipsOf(prev, idx))), masq.Node{}, ports...); err != nil {
		return []error{err}
	}
	return nil
}

// checkPeers reports how the kernel differs from the static peers of the
// backend section (overlay.Reconciler.Status: what a reconcile would change,
// computed without changing it). Peers from a registry are villaged's, and
// `villaged status` reports them.
func checkPeers(conf *netconf.NetConf, ips []*current.IPConfig) []error {
	b := conf.Overlay
	if !b.Routes() || b.Registry != nil {
		return nil
	}
	r, err := overlay.New(b.OverlayConfig(conf.Name))
	if err != nil {
		return []error{fmt.Errorf("backend %s: %w", b.Type, err)}
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), overlayDeadline)
	defer cancel()
	d, err := r.Status(ctx, overlay.Node{PodCIDRs: podSubnets(ips)}, b.Peers())
	if err != nil {
		return []error{fmt.Errorf("backend %s: failed to read the static peers' state: %w", b.Type, err)}
	}
	var drift []error
	for _, c := range d.Changes {
		drift = append(drift, fmt.Errorf("static peers of backend %s: %s needed", b.Type, c))
	}
	for _, p := range d.Problems {
		drift = append(drift, fmt.Errorf("static peers of backend %s: %w", b.Type, p.Err))
	}
	return drift
}

// CHECK's error codes: Village's own (the specification leaves 100 and up
// to plugins; village-ipam uses 100-102).
const (
	// ErrCodePodDrift: an interface, MAC, address or route of the pod is not
	// what ADD made. Re-creating the pod restores it.
	ErrCodePodDrift uint = 110
	// ErrCodeNodeDrift: only the node's side drifted: the bridge, its
	// gateway address, the pod's host veth, the netfilter rules or the
	// static peers.
	ErrCodeNodeDrift uint = 111
)

// drift is what CHECK found, grouped by where it is and what repairs it.
type drift struct {
	pod       []error // inside the pod: re-create the pod
	node      []error // bridge, gateway, host veth: re-create the pod (ADD restores them)
	netfilter []error // masquerade, forward accept, macspoofchk: the next ADD or villaged restores them
	peers     []error // static peers: the next ADD or `villaged sync` reconciles them
}

// asError turns the findings into one CNI error on one line (runtime logs
// and events split at newlines): where the drift is, each finding, and what
// to do about it.
func (d *drift) asError(args *skel.CmdArgs) error {
	node := append(append(append([]error{}, d.node...), d.netfilter...), d.peers...)
	if len(d.pod) == 0 && len(node) == 0 {
		return nil
	}
	code := ErrCodeNodeDrift
	var where []string
	if len(d.pod) > 0 {
		code = ErrCodePodDrift
		where = append(where, fmt.Sprintf("in the pod (netns %s): %s", args.Netns, masq.JoinLine(d.pod)))
	}
	if len(node) > 0 {
		where = append(where, fmt.Sprintf("on the node: %v", masq.JoinLine(node)))
	}
	var do []string
	if len(d.pod) > 0 || len(d.node) > 0 {
		do = append(do, "delete and re-create the pod (CNI DEL, then ADD) to restore it")
	}
	if len(d.netfilter) > 0 {
		do = append(do, "the next ADD on this node or `villaged sync` restores the netfilter rules (`villaged run` does within 10 s); find what flushed them (a firewall reload?)")
	}
	if len(d.peers) > 0 {
		do = append(do, "the next ADD on this node or `villaged sync` reconciles the static peers; if it cannot, check the backend section of the config and the underlay interface")
	}
	return types.NewError(code, fmt.Sprintf("CHECK of %q in container %q found drift %s; %s",
		args.IfName, args.ContainerID, strings.Join(where, ", and "), strings.Join(do, "; ")), "")
}

// podIfaceIndex finds CNI_IFNAME among prevResult's sandbox interfaces.
func podIfaceIndex(prev *current.Result, ifName string) int {
	for i, iface := range prev.Interfaces {
		if iface.Name == ifName && iface.Sandbox != "" {
			return i
		}
	}
	return -1
}

// podCheck names one pod interface CHECK verifies and the kind it must be.
type podCheck struct {
	ifName string
	kind   string // netlink link type: "veth", "macvlan"
}

func checkPod(pod *netsetup.Pod, pc podCheck, prev *current.Result) []error {
	idx := podIfaceIndex(prev, pc.ifName)
	if idx < 0 {
		return []error{fmt.Errorf("prevResult lists no interface %q inside a sandbox", pc.ifName)}
	}
	link, err := pod.LinkByName(pc.ifName)
	if err != nil {
		return []error{err}
	}
	if link == nil {
		return []error{fmt.Errorf("interface %q is missing", pc.ifName)}
	}
	var drift []error
	if link.Type() != pc.kind {
		drift = append(drift, fmt.Errorf("interface %q is a %s, not a %s", pc.ifName, link.Type(), pc.kind))
	}
	if want := prev.Interfaces[idx].Mac; want != "" && !strings.EqualFold(want, link.Attrs().HardwareAddr.String()) {
		drift = append(drift, fmt.Errorf("interface %q has MAC %s where ADD set %s", pc.ifName, link.Attrs().HardwareAddr, want))
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		drift = append(drift, fmt.Errorf("interface %q is down", pc.ifName))
	}
	addrs, err := netsetup.AddrList(pod.Handle(), link, netlink.FAMILY_ALL)
	if err != nil {
		return append(drift, fmt.Errorf("failed to list addresses of %q: %w", pc.ifName, err))
	}
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface != idx {
			continue
		}
		if !hasAddr(addrs, &ipc.Address) {
			drift = append(drift, fmt.Errorf("address %s is missing from %q", ipc.Address.String(), pc.ifName))
		}
	}
	return drift
}

// checkRoutes verifies every route of prevResult inside the pod.
func checkRoutes(pod *netsetup.Pod, prev *current.Result) []error {
	routes, err := pod.Handle().RouteList(nil, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return []error{fmt.Errorf("failed to list routes: %w", err)}
	}
	var drift []error
	for _, r := range prev.Routes {
		if hasKernelRoute(routes, r) {
			continue
		}
		if r.GW == nil {
			drift = append(drift, fmt.Errorf("route %s is missing", r.Dst.String()))
		} else {
			drift = append(drift, fmt.Errorf("route %s via %s is missing", r.Dst.String(), r.GW))
		}
	}
	return drift
}

func hasAddr(addrs []netlink.Addr, want *net.IPNet) bool {
	for _, a := range addrs {
		if a.IPNet.IP.Equal(want.IP) && a.IPNet.Mask.String() == want.Mask.String() {
			return true
		}
	}
	return false
}

func hasKernelRoute(routes []netlink.Route, want *types.Route) bool {
	for _, r := range routes {
		dst := r.Dst
		if dst == nil {
			continue
		}
		if dst.String() != want.Dst.String() {
			continue
		}
		if want.GW == nil || want.GW.Equal(r.Gw) {
			return true
		}
	}
	// The kernel reports default routes with a zero destination on some
	// versions and none on others.
	if ones, _ := want.Dst.Mask.Size(); ones == 0 {
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && (want.GW == nil || want.GW.Equal(r.Gw)) && (r.Gw == nil || (r.Gw.To4() != nil) == (want.Dst.IP.To4() != nil)) {
				return true
			}
		}
	}
	return false
}

func checkHost(conf *netconf.NetConf, args *skel.CmdArgs, prev *current.Result) []error {
	l, err := netlinksafe.LinkByName(conf.Bridge)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return []error{fmt.Errorf("bridge %q is missing", conf.Bridge)}
	}
	if err != nil {
		return []error{fmt.Errorf("failed to look up bridge %q: %w", conf.Bridge, err)}
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return []error{fmt.Errorf("%q is a %s, not a bridge", conf.Bridge, l.Type())}
	}
	var drift []error
	hostName := netsetup.HostVethName(args.ContainerID, args.IfName)
	host, err := netlinksafe.LinkByName(hostName)
	switch {
	case errors.As(err, &notFound):
		drift = append(drift, fmt.Errorf("host veth %q is missing", hostName))
	case err != nil:
		drift = append(drift, fmt.Errorf("failed to look up host veth %q: %w", hostName, err))
	case host.Attrs().MasterIndex != br.Index:
		drift = append(drift, fmt.Errorf("host veth %q is not attached to bridge %q", hostName, conf.Bridge))
	}
	ips := ipsOf(prev, podIfaceIndex(prev, args.IfName))
	if conf.IsGateway || conf.IsDefaultGW {
		addrs, err := netsetup.AddrList(nil, br, netlink.FAMILY_ALL)
		if err != nil {
			return append(drift, fmt.Errorf("failed to list addresses of bridge %q: %w", conf.Bridge, err))
		}
		for _, ipc := range ips {
			if ipc.Gateway == nil {
				continue
			}
			gw := &net.IPNet{IP: ipc.Gateway, Mask: ipc.Address.Mask}
			if !hasAddr(addrs, gw) {
				drift = append(drift, fmt.Errorf("gateway %s is missing from bridge %q", gw, conf.Bridge))
			}
		}
	}
	return drift
}

// ipsOf returns the addresses prevResult puts on interface idx.
func ipsOf(prev *current.Result, idx int) []*current.IPConfig {
	var out []*current.IPConfig
	for _, ipc := range prev.IPs {
		if ipc.Interface != nil && *ipc.Interface == idx {
			out = append(out, ipc)
		}
	}
	return out
}
