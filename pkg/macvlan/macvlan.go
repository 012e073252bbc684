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
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/netsetup"
)

// Config is the `macvlan` section of a village config.
type Config struct {
	Master   string          `json:"master"`
	Mode     string          `json:"mode"`
	IfName   string          `json:"ifName"`
	MTU      int             `json:"mtu"`
	MAC      string          `json:"mac"`
	HostShim bool            `json:"hostShim"`
	IPAM     json.RawMessage `json:"ipam"`

	// Derived by Parse.
	IPAMType string           `json:"-"`
	HWAddr   net.HardwareAddr `json:"-"`
	LinkMode netlink.MacvlanMode
	// Ranges are the LAN ranges of the IPAM block ("subnet" or
	// rangeStart-rangeEnd), which the host shim routes.
	Ranges []cidr.Range `json:"-"`
}

// DefaultIfName is the pod-side name of the LAN interface.
const DefaultIfName = "net1"

var modes = map[string]netlink.MacvlanMode{
	"bridge":   netlink.MACVLAN_MODE_BRIDGE,
	"private":  netlink.MACVLAN_MODE_PRIVATE,
	"vepa":     netlink.MACVLAN_MODE_VEPA,
	"passthru": netlink.MACVLAN_MODE_PASSTHRU,
}

func invalid(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid \"macvlan\": "+fmt.Sprintf(format, a...), "")
}

// validLinkName is utils.ValidateInterfaceName plus NUL, at which the
// kernel would silently cut the name ("eth0\x00x" would mean eth0).
func validLinkName(name string) *types.Error {
	if err := utils.ValidateInterfaceName(name); err != nil {
		return err
	}
	if strings.IndexByte(name, 0) >= 0 {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name contains a NUL byte", name)
	}
	return nil
}

// Parse validates a raw macvlan section. A nil/empty section returns nil.
// That ifName differs from CNI_IFNAME is checked by the plugin's ADD, which
// knows CNI_IFNAME.
func Parse(raw json.RawMessage) (*Config, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	c := &Config{}
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, invalid("%v", err)
	}
	if c.IfName == "" {
		c.IfName = DefaultIfName
	}
	if err := validLinkName(c.IfName); err != nil {
		return nil, invalid("\"ifName\" %q: %s", c.IfName, err.Msg)
	}
	if c.Master != "" {
		if err := validLinkName(c.Master); err != nil {
			return nil, invalid("\"master\" %q: %s", c.Master, err.Msg)
		}
	}
	if c.Mode == "" {
		c.Mode = "bridge"
	}
	mode, ok := modes[c.Mode]
	if !ok {
		return nil, invalid("\"mode\" %q: one of bridge, private, vepa, passthru", c.Mode)
	}
	c.LinkMode = mode
	if c.MTU < 0 || (c.MTU > 0 && c.MTU < 68) || c.MTU > 65535 {
		return nil, invalid("\"mtu\" %d: 0 (the master's) or 68-65535", c.MTU)
	}
	if c.MAC != "" {
		hw, err := net.ParseMAC(c.MAC)
		if err != nil || len(hw) != 6 || hw[0]&1 == 1 {
			return nil, invalid("\"mac\" %q: want a unicast 6-byte MAC", c.MAC)
		}
		c.HWAddr = hw
	}
	if err := c.parseIPAM(); err != nil {
		return nil, err
	}
	return c, nil
}

// parseIPAM reads just enough of the LAN IPAM block: its type (which must be
// a bare plugin name) and its ranges, for the host shim's routes.
func (c *Config) parseIPAM() error {
	var ipam struct {
		Type       string `json:"type"`
		Subnet     string `json:"subnet"`
		RangeStart string `json:"rangeStart"`
		RangeEnd   string `json:"rangeEnd"`
		Ranges     [][]struct {
			Subnet     string `json:"subnet"`
			RangeStart string `json:"rangeStart"`
			RangeEnd   string `json:"rangeEnd"`
		} `json:"ranges"`
	}
	if len(c.IPAM) == 0 {
		return invalid("\"ipam\" is required: the LAN interface needs an address")
	}
	if err := json.Unmarshal(c.IPAM, &ipam); err != nil {
		return invalid("\"ipam\": %v", err)
	}
	if ipam.Type == "" {
		return invalid("\"ipam.type\" is required")
	}
	c.IPAMType = ipam.Type
	add := func(subnet, start, end string) error {
		if subnet == "" {
			return nil
		}
		r, err := lanRange(subnet, start, end)
		if err != nil {
			return invalid("\"ipam\" range %s: %v", subnet, err)
		}
		c.Ranges = append(c.Ranges, r)
		return nil
	}
	if err := add(ipam.Subnet, ipam.RangeStart, ipam.RangeEnd); err != nil {
		return err
	}
	for _, set := range ipam.Ranges {
		for _, r := range set {
			if err := add(r.Subnet, r.RangeStart, r.RangeEnd); err != nil {
				return err
			}
		}
	}
	return nil
}

func lanRange(subnet, start, end string) (cidr.Range, error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return cidr.Range{}, err
	}
	p = p.Masked()
	r := cidr.Range{Start: p.Addr().Next(), End: cidr.Last(p).Prev()}
	if start != "" {
		if r.Start, err = netip.ParseAddr(start); err != nil {
			return cidr.Range{}, fmt.Errorf("rangeStart: %w", err)
		}
	}
	if end != "" {
		if r.End, err = netip.ParseAddr(end); err != nil {
			return cidr.Range{}, fmt.Errorf("rangeEnd: %w", err)
		}
	}
	if !p.Contains(r.Start) || !p.Contains(r.End) || r.End.Less(r.Start) {
		return cidr.Range{}, fmt.Errorf("range %s-%s is not inside %s in order", r.Start, r.End, p)
	}
	return r, nil
}

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
	Conf    *Config
	PodNSFd int
}

// Create makes the macvlan directly inside the pod namespace under its final
// name. The caller configures addresses through the pod handle.
func Create(p PodLink) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = p.Conf.IfName
	attrs.ParentIndex = p.Master.Attrs().Index
	attrs.MTU = p.Conf.MTU
	attrs.HardwareAddr = p.Conf.HWAddr
	attrs.Namespace = netlink.NsFd(p.PodNSFd)
	mv := &netlink.Macvlan{LinkAttrs: attrs, Mode: p.Conf.LinkMode}
	if err := netlink.LinkAdd(mv); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("failed to create macvlan %q on %q: an interface of that name already exists in the pod: %w", p.Conf.IfName, p.Master.Attrs().Name, err)
		}
		return fmt.Errorf("failed to create macvlan %q on master %q: %w", p.Conf.IfName, p.Master.Attrs().Name, err)
	}
	return nil
}
