// Package netsetup creates and checks the links Village puts on a node and
// into a pod: the bridge that holds the gateway, the veth pair that gives the
// pod its interface, and the addresses and routes on both sides.
//
// Every function here is an idempotent "ensure": it reads what the kernel
// already has, returns it when it fits, and changes only what does not, so a
// repeated ADD, or the second pod on a node, costs a few netlink reads.
// IPv4 and IPv6 go through the same code; the family is read off the address.
package netsetup

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Bridge describes the node bridge a network's pods attach to.
type Bridge struct {
	Name    string
	MTU     int // 0: leave as the kernel has it
	Promisc bool
	// VlanFiltering is set when pods get a VLAN tag on their port.
	VlanFiltering bool
}

// EnsureBridge returns the bridge named b.Name, creating it (up, with the
// requested MTU, passing what it forwards to iptables and ip6tables) when it
// is missing. An existing link of another kind is an
// error: Village never reuses or deletes a link it did not make.
func EnsureBridge(b Bridge) (*netlink.Bridge, error) {
	l, err := lookupBridge(b.Name)
	if err != nil && !IsNotFound(err) {
		return nil, fmt.Errorf("failed to look up bridge %q: %w", b.Name, err)
	}
	if l.link == nil {
		return createBridge(b)
	}
	br, ok := l.link.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("%q already exists but is a %s, not a bridge: rename the bridge in the config or remove that link", b.Name, l.link.Type())
	}
	if err := pinBridgeMAC(br); err != nil {
		return nil, err
	}
	return br, fixBridge(br, l.nfOn, b)
}

// BridgeMAC is the MAC Village gives a bridge it creates: derived from the
// name (locally administered, unicast), so a bridge that has it is known to
// have a MAC of its own without asking anything else.
func BridgeMAC(name string) net.HardwareAddr {
	return DeriveMAC("village bridge " + name)
}

// DeriveMAC is a locally administered unicast MAC from the hash of seed.
func DeriveMAC(seed string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(seed))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = (mac[0] | 0x02) &^ 0x01
	return mac
}

// pinBridgeMAC gives a bridge Village did not make (or made before bridge
// MACs were derived) a MAC of its own when it has none: such a bridge takes
// the lowest MAC of its ports, so the pods' gateway MAC would change when
// that pod goes. Setting the MAC it has now changes nothing for the pods and
// keeps it from then on. A bridge without ports gets BridgeMAC (no pod knows
// its MAC yet), so later ADDs see it is pinned without listing anything; a
// bridge whose MAC is no port's already has one of its own.
func pinBridgeMAC(br *netlink.Bridge) error {
	if bytes.Equal(br.HardwareAddr, BridgeMAC(br.Name)) {
		return nil
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return fmt.Errorf("failed to list the ports of bridge %q: %w", br.Name, err)
	}
	ports, following := 0, false
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Index {
			ports++
			following = following || bytes.Equal(l.Attrs().HardwareAddr, br.HardwareAddr)
		}
	}
	mac := br.HardwareAddr
	switch {
	case ports == 0:
		mac = BridgeMAC(br.Name)
	case !following:
		return nil
	}
	if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
		return fmt.Errorf("failed to give bridge %q a MAC of its own (%s): %w", br.Name, mac, err)
	}
	br.HardwareAddr = mac
	return nil
}

func createBridge(b Bridge) (*netlink.Bridge, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = b.Name
	// No MTU here: an MTU given at creation counts as automatic, and the
	// kernel resets it to 1500 when the last port leaves. fixBridge sets it
	// below through ndo_change_mtu, which the bridge keeps.
	attrs.TxQLen = -1
	attrs.Flags = net.FlagUp
	// A bridge without a MAC of its own takes the lowest of its ports', so
	// its MAC (the pods' gateway MAC) would change as pods come and go.
	attrs.HardwareAddr = BridgeMAC(b.Name)
	br := &netlink.Bridge{LinkAttrs: attrs}
	if b.VlanFiltering {
		on := true
		br.VlanFiltering = &on
	}
	if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, syscall.EEXIST) {
		return nil, fmt.Errorf("failed to create bridge %q%s: %w", b.Name, vlanHint(b, err), err)
	}
	// Re-read: parallel ADDs race to create the bridge, and the kernel
	// fills in the index and MAC.
	l, err := lookupBridge(b.Name)
	if err != nil {
		return nil, fmt.Errorf("failed to read back bridge %q: %w", b.Name, err)
	}
	got, ok := l.link.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("%q was created by someone else as a %s, not a bridge", b.Name, l.link.Type())
	}
	return got, fixBridge(got, l.nfOn, b)
}

// fixBridge brings an existing bridge to the spec, touching only what
// differs. nfOn says the bridge already sends what it forwards through
// netfilter (see brnf.go); Village's bridges always do.
func fixBridge(br *netlink.Bridge, nfOn bool, b Bridge) error {
	if !nfOn {
		if err := setBridgeNfCalls(br); err != nil {
			return err
		}
	}
	if b.MTU > 0 && br.MTU != b.MTU {
		if err := netlink.LinkSetMTU(br, b.MTU); err != nil {
			return fmt.Errorf("failed to set MTU %d on bridge %q: %w", b.MTU, b.Name, err)
		}
		br.MTU = b.MTU
	}
	if b.Promisc && br.Promisc == 0 {
		if err := netlink.SetPromiscOn(br); err != nil {
			return fmt.Errorf("failed to set promiscuous mode on bridge %q: %w", b.Name, err)
		}
	}
	if b.VlanFiltering && (br.VlanFiltering == nil || !*br.VlanFiltering) {
		if err := netlink.BridgeSetVlanFiltering(br, true); err != nil {
			return fmt.Errorf("failed to turn on VLAN filtering on bridge %q%s: %w", b.Name, vlanHint(b, err), err)
		}
	}
	if br.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return fmt.Errorf("failed to set bridge %q up: %w", b.Name, err)
		}
	}
	return nil
}

// vlanHint explains an EOPNOTSUPP from a bridge that was to filter VLANs:
// the kernel was built without bridge VLAN filtering.
func vlanHint(b Bridge, err error) string {
	if b.VlanFiltering && errors.Is(err, syscall.EOPNOTSUPP) {
		return ` with VLAN filtering ("vlan" needs a kernel built with CONFIG_BRIDGE_VLAN_FILTERING)`
	}
	return ""
}

// GatewaySpec is one gateway address to hold on the bridge.
type GatewaySpec struct {
	Addr  *net.IPNet // gateway IP with the pod subnet's mask
	Force bool       // replace a conflicting address instead of failing
}

// EnsureGateway puts gw on link unless it is there already. Another address
// of the same family that conflicts (any other IPv4 address; an overlapping
// IPv6 one) is an error naming both, unless Force, which replaces it.
func EnsureGateway(link netlink.Link, gw GatewaySpec) error {
	name := link.Attrs().Name
	addrs, err := AddrList(nil, link, Family(gw.Addr.IP))
	if err != nil {
		return fmt.Errorf("failed to list addresses of %q: %w", name, err)
	}
	want := gw.Addr.String()
	for _, a := range addrs {
		if a.IPNet.String() == want {
			return nil
		}
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() || !conflicts(a.IPNet, gw.Addr) {
			continue
		}
		if !gw.Force {
			return fmt.Errorf("bridge %q already has address %s, which differs from the gateway %s this network wants: set \"forceAddress\": true to replace it, or use another bridge", name, a.IPNet, want)
		}
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("failed to remove address %s from %q: %w", a.IPNet, name, err)
		}
	}
	addr := &netlink.Addr{IPNet: gw.Addr, Flags: nodadFlag(gw.Addr.IP)}
	if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("failed to add gateway %s to %q: %w", want, name, err)
	}
	return nil
}

// conflicts follows the reference bridge: one IPv4 address per bridge, while
// IPv6 subnets may coexist when they do not overlap.
func conflicts(have, want *net.IPNet) bool {
	if Family(want.IP) == netlink.FAMILY_V4 {
		return true
	}
	return have.Contains(want.IP) || want.Contains(have.IP)
}

// EnableForwarding turns on IP forwarding for each family in ips, writing
// the sysctl only when it is off.
func EnableForwarding(ips []net.IP) error {
	for _, f := range families(ips) {
		path := "/proc/sys/net/ipv4/ip_forward"
		if f == netlink.FAMILY_V6 {
			path = "/proc/sys/net/ipv6/conf/all/forwarding"
		}
		if err := ensureSysctl(path, "1"); err != nil {
			return err
		}
	}
	return nil
}

func ensureSysctl(path, val string) error {
	b, err := os.ReadFile(path)
	if err == nil && len(b) > 0 && string(b[:len(b)-1]) == val {
		return nil
	}
	if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
		return fmt.Errorf("failed to set %s to %s: %w", path, val, err)
	}
	return nil
}

func families(ips []net.IP) []int {
	var out []int
	seen := map[int]bool{}
	for _, ip := range ips {
		f := Family(ip)
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// Family returns netlink.FAMILY_V4 or FAMILY_V6 for ip.
func Family(ip net.IP) int {
	if ip.To4() != nil {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// nodadFlag skips duplicate address detection for IPv6 addresses that IPAM
// owns: DAD would hold the address tentative for a second or more, and the
// allocator already guarantees uniqueness.
func nodadFlag(ip net.IP) int {
	if Family(ip) == netlink.FAMILY_V6 {
		return unix.IFA_F_NODAD
	}
	return 0
}

// IsNotFound reports whether err says a link does not exist.
func IsNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// AddrList lists link's addresses through h (nil: the current namespace),
// retrying a dump the kernel interrupted.
func AddrList(h *netlink.Handle, link netlink.Link, family int) ([]netlink.Addr, error) {
	if h == nil {
		return netlinksafe.AddrList(link, family)
	}
	var addrs []netlink.Addr
	var err error
	for range 5 {
		addrs, err = h.AddrList(link, family)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return addrs, err
}
