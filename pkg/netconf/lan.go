package netconf

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/validate"
)

// LAN is the `macvlan` section of a village config: the pod's LAN
// interface (made by pkg/macvlan).
type LAN struct {
	Master   string          `json:"master"`
	Mode     string          `json:"mode"`
	IfName   string          `json:"ifName"`
	MTU      int             `json:"mtu"`
	MAC      string          `json:"mac"`
	HostShim bool            `json:"hostShim"`
	IPAM     json.RawMessage `json:"ipam"`
	// Pods is which pods get the LAN interface: PodsAll (every pod, the
	// default) or PodsAnnotated (only pods that ask: lanpods.go).
	Pods string `json:"pods,omitempty"`
	// ServicesRaw is "services": LoadBalancer Services on the LAN
	// (lansvc.go); Services is it parsed, nil when absent.
	ServicesRaw json.RawMessage `json:"services,omitempty"`
	Services    *Services       `json:"-"`

	// Derived by Parse.
	IPAMType string           `json:"-"`
	HWAddr   net.HardwareAddr `json:"-"`
	LinkMode netlink.MacvlanMode
	// Ranges are the LAN ranges of the IPAM block ("subnet" or
	// rangeStart-rangeEnd), which the host shim routes.
	Ranges []cidr.Range `json:"-"`
	// DHCPSocket is villaged's DHCP socket when IPAMType is LANDHCP
	// ("daemonSocketPath", as the reference dhcp plugin names it); ""
	// means the default (wire.SocketPath).
	DHCPSocket string `json:"-"`
	// Sets are the same ranges as the IPAM config parsed them (with their
	// gateways), which a pod's requested address is checked against.
	Sets []config.RangeSet `json:"-"`
}

// LANDHCP is the LAN IPAM type served by villaged's DHCP client
// (pkg/landhcp): the pod's LAN address comes from the LAN's own DHCP
// server. No IPAM plugin is exec'd for it.
const LANDHCP = "dhcp"

// DefaultLANIfName is the pod-side name of the LAN interface.
const DefaultLANIfName = "net1"

var macvlanModes = map[string]netlink.MacvlanMode{
	"bridge":   netlink.MACVLAN_MODE_BRIDGE,
	"private":  netlink.MACVLAN_MODE_PRIVATE,
	"vepa":     netlink.MACVLAN_MODE_VEPA,
	"passthru": netlink.MACVLAN_MODE_PASSTHRU,
}

func invalidLAN(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid \"macvlan\": "+fmt.Sprintf(format, a...), "")
}

// ParseLAN validates a raw macvlan section. A nil/empty section returns nil.
// That ifName differs from CNI_IFNAME is checked by the plugin's ADD, which
// knows CNI_IFNAME.
func ParseLAN(raw json.RawMessage) (*LAN, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	c := &LAN{}
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, invalidLAN("%v", err)
	}
	if c.IfName == "" {
		c.IfName = DefaultLANIfName
	}
	if err := validate.LinkName(c.IfName); err != nil {
		return nil, invalidLAN("\"ifName\": %v", err)
	}
	if c.Master != "" {
		if err := validate.LinkName(c.Master); err != nil {
			return nil, invalidLAN("\"master\": %v", err)
		}
	}
	if c.Mode == "" {
		c.Mode = "bridge"
	}
	mode, ok := macvlanModes[c.Mode]
	if !ok {
		return nil, invalidLAN("\"mode\" %q: one of bridge, private, vepa, passthru", c.Mode)
	}
	c.LinkMode = mode
	if err := validate.MTU(c.MTU); err != nil {
		return nil, invalidLAN("\"mtu\": %v (0 is the master's)", err)
	}
	if c.MAC != "" {
		hw, err := validate.MAC(c.MAC)
		if err != nil {
			return nil, invalidLAN("\"mac\": %v", err)
		}
		c.HWAddr = hw
	}
	if err := c.parseIPAM(); err != nil {
		return nil, err
	}
	if err := c.parsePods(); err != nil {
		return nil, err
	}
	if err := c.parseServices(); err != nil {
		return nil, err
	}
	return c, nil
}

// parseIPAM reads just enough of the LAN IPAM block, through the IPAM
// config package (the block may belong to another plugin with host-local's
// range keys): its type, which must be a bare plugin name, and its ranges,
// for the host shim's routes.
func (c *LAN) parseIPAM() error {
	if len(c.IPAM) == 0 {
		return invalidLAN("\"ipam\" is required: the LAN interface needs an address")
	}
	typ, sets, err := config.ParseRanges(c.IPAM)
	if err != nil {
		return invalidLAN("\"ipam\": %v", err)
	}
	if typ == "" {
		return invalidLAN("\"ipam.type\" is required")
	}
	c.IPAMType = typ
	c.Sets = sets
	for _, set := range sets {
		for _, r := range set {
			c.Ranges = append(c.Ranges, cidr.Range{Start: r.RangeStart, End: r.RangeEnd})
		}
	}
	if typ == LANDHCP {
		return c.parseDHCP()
	}
	return nil
}

// parseDHCP checks a "dhcp" LAN IPAM block: its socket path, and ranges
// when the host shim is on (the DHCP server's pool, which the shim routes:
// the leases are not known in advance).
func (c *LAN) parseDHCP() error {
	var d struct {
		Socket string `json:"daemonSocketPath"`
	}
	if err := json.Unmarshal(c.IPAM, &d); err != nil {
		return invalidLAN("\"ipam\": %v", err)
	}
	if d.Socket != "" && !filepath.IsAbs(d.Socket) {
		return invalidLAN("\"ipam.daemonSocketPath\" %q: an absolute path is required", d.Socket)
	}
	c.DHCPSocket = d.Socket
	if c.HostShim && len(c.Ranges) == 0 {
		return invalidLAN("\"hostShim\" with \"ipam.type\" dhcp needs \"ipam.ranges\": the DHCP server's pool, which the host shim routes to the pods")
	}
	return nil
}
