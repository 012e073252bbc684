package village

import (
	"fmt"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
)

// addLAN gives the pod its second interface, a macvlan on the node's LAN,
// with the addresses of the LAN claim (a separate record: its own
// CNI_IFNAME and ipam block), which sendClaims started. The default route
// stays on eth0.
func (a *adder) addLAN() error {
	lan := a.conf.LAN
	if lan == nil || (a.lan == nil && a.dhcp == nil) {
		return nil // no macvlan section, or this pod did not ask (lanpods.go)
	}
	a.lanFailed = true
	master := a.lanMaster
	mac := lan.HWAddr
	if mac == nil && a.conf.Pod.IsSet() {
		// Stable across restarts and nodes: LAN hosts' neighbour caches
		// and a router's reservations stay valid for this pod.
		mac = macvlan.StableMAC(a.conf.Name, a.conf.Pod.Namespace, a.conf.Pod.Name)
	}
	link, err := a.ensureLANLink(master.Attrs().Name, lan, func() error {
		if err := macvlan.Create(macvlan.PodLink{Master: master, Name: lan.IfName, MTU: lan.MTU, MAC: mac, Mode: lan.LinkMode, PodNSFd: int(a.pod.NS().Fd())}); err != nil {
			return err
		}
		// Before the link goes up with its addresses, so the kernel
		// announces them as it comes up (a new link: a repeated ADD of a
		// live one announces nothing).
		return macvlan.AnnounceOnUp(a.pod.NS(), lan.IfName, lanHasV6(lan))
	})
	if err != nil {
		return err
	}
	res, err := a.lanAddresses(link)
	if err != nil {
		return fmt.Errorf("LAN interface %q: %w", lan.IfName, err)
	}
	if err := a.pod.ConfigurePod(podIface(link, res, res.IPs)); err != nil {
		return err
	}
	if err := a.ensureLANMulticast(link, res.IPs); err != nil {
		return err
	}
	a.lanFailed = false
	idx := len(a.result.Interfaces)
	a.result.Interfaces = append(a.result.Interfaces, &current.Interface{
		Name: lan.IfName, Mac: link.Attrs().HardwareAddr.String(), Mtu: link.Attrs().MTU, Sandbox: a.args.Netns,
	})
	for _, ipc := range res.IPs {
		ipc.Interface = current.Int(idx)
		a.result.IPs = append(a.result.IPs, ipc)
	}
	a.result.Routes = append(a.result.Routes, res.Routes...)
	if lan.HostShim {
		return macvlan.EnsureShim(master, lan.Ranges, a.conf.Name)
	}
	return nil
}

// ensureLANLink returns the pod's LAN link, creating it (and registering its
// undo) unless a previous ADD of this container made it.
func (a *adder) ensureLANLink(master string, lan *netconf.LAN, create func() error) (netlink.Link, error) {
	existing, err := a.pod.LinkByName(lan.IfName)
	if err != nil {
		return nil, err
	}
	if existing != nil {
		if !netsetup.OwnedBy(existing, a.args.ContainerID) {
			return nil, fmt.Errorf("interface %q already exists in netns %q and was not made for container %q: choose another \"macvlan.ifName\" or remove it", lan.IfName, a.args.Netns, a.args.ContainerID)
		}
		return existing, nil
	}
	if err := create(); err != nil {
		return nil, err
	}
	a.undo.Push(fmt.Sprintf("delete macvlan %q on %q", lan.IfName, master), func() error {
		return a.pod.DeleteLink(lan.IfName)
	})
	link, err := a.pod.LinkByName(lan.IfName)
	if err != nil || link == nil {
		return nil, fmt.Errorf("macvlan %q vanished from netns %q: %w", lan.IfName, a.args.Netns, err)
	}
	return link, a.pod.TagOwner(link, a.args.ContainerID)
}

// lanHasV6 tells whether the LAN block hands out IPv6 addresses (its ranges;
// a DHCP lease is IPv4 only), so that net1 also announces itself by
// unsolicited neighbour advertisement.
func lanHasV6(lan *netconf.LAN) bool {
	for _, r := range lan.Ranges {
		if r.Start.Is6() {
			return true
		}
	}
	return false
}
