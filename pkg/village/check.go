package village

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
)

// Check is the CNI CHECK verb: it compares what the kernel has with the
// prevResult and names every piece that drifted.
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

	var drift []error
	drift = append(drift, checkPod(pod, podCheck{ifName: args.IfName, kind: "veth", args: args}, prev)...)
	if conf.LAN != nil {
		drift = append(drift, checkPod(pod, podCheck{ifName: conf.LAN.IfName, kind: "macvlan", args: args}, prev)...)
	}
	drift = append(drift, checkRoutes(pod, args, prev)...)
	drift = append(drift, checkHost(conf, args, prev)...)
	// Static peers are ensured on CHECK too, so a peer removed from the list
	// leaves the kernel without waiting for the next ADD.
	if _, err := syncOverlay(conf, ipsOf(prev, podIfaceIndex(prev, args.IfName))); err != nil {
		drift = append(drift, err)
	}
	if len(drift) > 0 {
		return fmt.Errorf("CHECK of %q in %s found drift: %w", args.IfName, args.Netns, joinDrift(drift))
	}
	return nil
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
	args   *skel.CmdArgs
}

func checkPod(pod *netsetup.Pod, pc podCheck, prev *current.Result) []error {
	args := pc.args
	idx := podIfaceIndex(prev, pc.ifName)
	if idx < 0 {
		return []error{fmt.Errorf("prevResult lists no interface %q inside a sandbox", pc.ifName)}
	}
	link, err := pod.LinkByName(pc.ifName)
	if err != nil {
		return []error{err}
	}
	if link == nil {
		return []error{fmt.Errorf("interface %q is missing from netns %q", pc.ifName, args.Netns)}
	}
	var drift []error
	if link.Type() != pc.kind {
		drift = append(drift, fmt.Errorf("interface %q is a %s, not a %s", pc.ifName, link.Type(), pc.kind))
	}
	if want := prev.Interfaces[idx].Mac; want != "" && !strings.EqualFold(want, link.Attrs().HardwareAddr.String()) {
		drift = append(drift, fmt.Errorf("interface %q has MAC %s, prevResult says %s", pc.ifName, link.Attrs().HardwareAddr, want))
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
func checkRoutes(pod *netsetup.Pod, args *skel.CmdArgs, prev *current.Result) []error {
	var drift []error
	routes, err := pod.Handle().RouteList(nil, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return append(drift, fmt.Errorf("failed to list routes in netns %q: %w", args.Netns, err))
	}
	for _, r := range prev.Routes {
		if !hasKernelRoute(routes, r) {
			drift = append(drift, fmt.Errorf("route %s via %v is missing from netns %q", r.Dst.String(), r.GW, args.Netns))
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
	if err != nil {
		return []error{fmt.Errorf("bridge %q is missing: %w", conf.Bridge, err)}
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return []error{fmt.Errorf("%q is a %s, not a bridge", conf.Bridge, l.Type())}
	}
	var drift []error
	hostName := netsetup.HostVethName(args.ContainerID, args.IfName)
	host, err := netlinksafe.LinkByName(hostName)
	switch {
	case err != nil:
		drift = append(drift, fmt.Errorf("host veth %q is missing: %w", hostName, err))
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
	if conf.IPMasq {
		if err := masq.Check(masqSpec(conf, ips)); err != nil {
			drift = append(drift, err)
		}
	}
	return drift
}

// joinDrift joins drift reports on one line: CNI error messages are read in
// runtime logs and events, where a newline splits the story.
func joinDrift(errs []error) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return &driftError{msg: strings.Join(msgs, "; "), errs: errs}
}

type driftError struct {
	msg  string
	errs []error
}

func (d *driftError) Error() string   { return d.msg }
func (d *driftError) Unwrap() []error { return d.errs }

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
