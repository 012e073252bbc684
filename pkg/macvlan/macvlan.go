// Package macvlan gives a pod its second interface: a macvlan on the node's
// LAN interface (the "master"), with an address from a LAN range, so other
// machines on the home or office network reach the pod directly while the
// pod keeps eth0 on the bridge as its default route.
//
// A macvlan child cannot talk to its own master: frames between them never
// cross. So a node cannot reach its own pods' LAN addresses through the
// master. The host shim fixes that: one more macvlan, on the node side, in
// bridge mode on the same master (children of one master in bridge mode do
// reach each other), plus routes for the pods' LAN range through it. The
// shim is created once per node and master, shared by every pod, and only
// an uninstall removes it.
package macvlan

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/netsetup"
)

// ResolveMaster returns the master link: the named one, or the interface of
// the node's default route. It must exist and be up.
func ResolveMaster(name string) (netlink.Link, error) {
	if name == "" {
		var err error
		if name, err = defaultRouteLink(); err != nil {
			return nil, err
		}
	}
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("macvlan master %q not found on this node: set \"macvlan.master\" to the LAN interface", name), err.Error())
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("macvlan master %q is down: bring it up (ip link set %s up)", name, name), "")
	}
	return l, nil
}

func defaultRouteLink() (string, error) {
	link, _, err := netsetup.DefaultRouteLink(nil)
	if err != nil {
		return "", err
	}
	if link == nil {
		return "", types.NewError(types.ErrInvalidNetworkConfig,
			"\"macvlan.master\" is empty and this node has no default route to take the LAN interface from: set \"macvlan.master\"", "")
	}
	return link.Attrs().Name, nil
}

// PodLink describes the macvlan to create inside a pod.
type PodLink struct {
	Master  netlink.Link
	Name    string // the pod-side name
	MTU     int    // 0: the master's
	MAC     net.HardwareAddr
	Mode    netlink.MacvlanMode
	PodNSFd int
}

// Create makes the macvlan directly inside the pod namespace under its final
// name. The caller configures addresses through the pod handle.
func Create(p PodLink) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = p.Name
	attrs.ParentIndex = p.Master.Attrs().Index
	attrs.MTU = p.MTU
	attrs.HardwareAddr = p.MAC
	attrs.Namespace = netlink.NsFd(p.PodNSFd)
	mv := &netlink.Macvlan{LinkAttrs: attrs, Mode: p.Mode}
	if err := netlink.LinkAdd(mv); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("failed to create macvlan %q on %q: an interface of that name already exists in the pod: %w", p.Name, p.Master.Attrs().Name, err)
		}
		return fmt.Errorf("failed to create macvlan %q on master %q: %w", p.Name, p.Master.Attrs().Name, err)
	}
	return nil
}
