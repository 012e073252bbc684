package overlay

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/owner"
	"github.com/village-cni/village/pkg/validate"
	"github.com/village-cni/village/pkg/wireguard"
)

// RouteProtocol marks the routes this package owns (86, ASCII 'V'; unused by
// iproute2's rt_protos and by the common routing daemons).
const RouteProtocol netlink.RouteProtocol = 0x56

const (
	// DefaultVNI is the VXLAN network identifier when Config.VNI is 0.
	DefaultVNI = 1
	// DefaultPort is the VXLAN UDP port when Config.Port is 0 (IANA's).
	DefaultPort = 4789
	// DevicePrefix starts the name of every VXLAN device: village.<vni>.
	DevicePrefix = "village."

	overhead4 = 50 // outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14
	overhead6 = 70 // outer IPv6 40 + the same 30
)

// Mode is the backend carrying traffic to peers.
type Mode string

// The backends.
const (
	ModeNone   Mode = "none"    // single node: nothing to peers; Set removes what is owned
	ModeVXLAN  Mode = "vxlan"   // every peer over the VXLAN device
	ModeHostGW Mode = "host-gw" // every peer routed via its underlay address
	ModeAuto   Mode = "auto"    // host-gw on the underlay's L2 subnet, vxlan otherwise
	// ModeWireGuard: every peer through this node's WireGuard device,
	// encrypted (peers need a WireGuardKey).
	ModeWireGuard Mode = "wireguard"
)

// Sentinel errors, matched with errors.Is on what Set and Status return.
var (
	ErrConfig    = errors.New("invalid overlay configuration")
	ErrOffSubnet = errors.New("peer is not on the underlay's subnet (host-gw needs one L2 segment; use auto or vxlan)")
	ErrFamily    = errors.New("address families do not match")
	ErrConflict  = errors.New("conflicting object")
)

// Node is one node of the cluster as the overlay sees it.
type Node struct {
	Name     string
	IP       net.IP       // underlay address
	PodCIDRs []*net.IPNet // the node's pod subnets (IPv4 and/or IPv6)
	// VtepMAC is the MAC of the node's VXLAN device; nil means DeriveMAC(IP).
	VtepMAC net.HardwareAddr
	// WireGuardKey is the node's WireGuard public key (ModeWireGuard; zero:
	// none published, the node is not routed).
	WireGuardKey wgtypes.Key
	// WireGuardEndpoint is where the node receives WireGuard; nil means
	// IP at this network's port.
	WireGuardEndpoint *net.UDPAddr
	// WireGuardHub: the node relays WireGuard traffic between peers that
	// cannot reach each other (the kubernetes registry's Node label; see
	// also WireGuardConfig.Hubs and package wireguard's relay.go).
	WireGuardHub bool
}

// Config selects the backend and the VXLAN parameters.
type Config struct {
	Mode     Mode
	Underlay string // interface name; "" = the interface of the default route
	VNI      int    // 0 = DefaultVNI
	// Port is the VXLAN port (0 = DefaultPort), or under ModeWireGuard the
	// WireGuard listen port (0 = DefaultWireGuardPort).
	Port int
	// Network names the network these objects belong to (the conflist's
	// name). It sets the metric of every route ([Metric]) and the alias of
	// the VXLAN device ([Alias]), which is how a network tells its objects
	// from another network's on the same node.
	Network string
	// NetNS is the path of the network namespace to manage ("" = the
	// namespace of the thread calling New). Sockets are bound to it once, so
	// the Reconciler can be used from any goroutine. ModeWireGuard needs
	// "": its device lives in the process's own namespace.
	NetNS string
	// WireGuard configures ModeWireGuard's device.
	WireGuard WireGuardConfig
}

// Validate reports (wrapping ErrConfig) what New would reject in c: the
// mode, VNI, port and the device name. The plugin's config parser calls
// it, so the limits live only here.
func (c Config) Validate() error {
	_, err := c.normalize()
	return err
}

func (c Config) normalize() (Config, error) {
	switch c.Mode {
	case ModeNone, ModeVXLAN, ModeHostGW, ModeAuto, ModeWireGuard:
	case "":
		c.Mode = ModeNone
	default:
		return c, fmt.Errorf("%w: mode %q (want none, vxlan, host-gw, auto or wireguard)", ErrConfig, c.Mode)
	}
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	if c.Port == 0 {
		c.Port = DefaultPort
		if c.Mode == ModeWireGuard {
			c.Port = DefaultWireGuardPort
		}
	}
	if c.Mode == ModeWireGuard {
		if err := c.WireGuard.validate(c); err != nil {
			return c, err
		}
	}
	switch {
	case c.VNI < 1 || c.VNI > 1<<24-1:
		return c, fmt.Errorf("%w: vni %d (want 1..16777215)", ErrConfig, c.VNI)
	case c.Port < 1 || c.Port > 65535:
		return c, fmt.Errorf("%w: port %d (want 1..65535)", ErrConfig, c.Port)
	}
	if err := validate.LinkName(DeviceName(c.VNI)); err != nil {
		return c, fmt.Errorf("%w: VXLAN device of vni %d: %w", ErrConfig, c.VNI, err)
	}
	return c, nil
}

// DeviceName is the VXLAN device of a VNI: village.<vni>.
func DeviceName(vni int) string { return DevicePrefix + strconv.Itoa(vni) }

// Metric is the metric of every route of network: 0x56 (RouteProtocol) in
// the top byte, the network's owner.Tag below (see package owner for why a
// metric). A route is this network's when it has protocol RouteProtocol
// and this metric.
func Metric(network string) int { return owner.Metric(uint8(RouteProtocol), network) }

// Alias is the interface alias (IFLA_IFALIAS) the VXLAN device of network
// carries: the kernel keeps it with the device, so a network only changes or
// removes a device with its own alias.
func Alias(network string) string { return "village network " + network }

// DeriveMAC is the VTEP MAC of a node with underlay address ip: 0e:76
// (locally administered, unicast) followed by the IPv4 address, or by the
// first four bytes of the SHA-256 of an IPv6 address. Every node computes
// every peer's MAC the same way, so nothing needs to be exchanged.
func DeriveMAC(ip net.IP) net.HardwareAddr {
	tail := ip.To4()
	if tail == nil {
		sum := sha256.Sum256(ip.To16())
		tail = sum[:4]
	}
	return append(net.HardwareAddr{0x0e, 0x76}, tail...)
}

// Overhead is the VXLAN encapsulation overhead over an underlay address of
// underlayIP's family: 50 bytes for IPv4, 70 for IPv6.
func Overhead(underlayIP net.IP) int {
	if underlayIP.To4() != nil {
		return overhead4
	}
	return overhead6
}

// Reconciler applies a desired set of peers to one network namespace. Set,
// Status and Teardown read the kernel every time and keep no state besides
// their netlink sockets; Set leaves a baseline (the peers and plan it
// applied) that Update uses, and that Set and Status plan with again when
// their inputs are the baseline's. Calls are serialized.
type Reconciler struct {
	cfg    Config
	metric int // Metric(cfg.Network)

	mu   sync.Mutex
	h    *netlink.Handle
	dump *nl.SocketHandle // the neighbour dumps' socket (neighDump), opened on first use
	base *baseline        // last successful Set or Update; nil: Update needs a Set

	wg    *wireguard.Device // ModeWireGuard's device once a Set made it
	wgKey wgtypes.Key       // this node's private key, loaded on first use
	// wgWant is the device's peer list of the last Set (for
	// RefreshWireGuardPaths).
	wgWant []wireguard.Peer
}

// New opens a netlink socket in cfg.NetNS (or the current namespace).
func New(cfg Config) (*Reconciler, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	h, err := openHandle(cfg.NetNS)
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, metric: Metric(cfg.Network), h: h}, nil
}

func openHandle(path string) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := atNamespace(path, func(at netns.NsHandle) (err error) {
		if h, err = netlink.NewHandleAt(at, unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("opening netlink socket%s: %w", inPath(path), err)
		}
		return nil
	})
	return h, err
}

// atNamespace calls open with the network namespace at path, or with
// netns.None() (the current namespace) when path is empty.
func atNamespace(path string, open func(netns.NsHandle) error) error {
	if path == "" {
		return open(netns.None())
	}
	nsh, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	defer nsh.Close()
	return open(nsh)
}

// inPath is " in <path>" for a namespace path, "" for the current one.
func inPath(path string) string {
	if path == "" {
		return ""
	}
	return " in " + path
}

// Config returns the configuration with defaults filled in.
func (r *Reconciler) Config() Config { return r.cfg }

// Device is the name of this network's VXLAN device.
func (r *Reconciler) Device() string { return DeviceName(r.cfg.VNI) }

// Close releases the netlink socket. Kernel state stays as it is, except
// that a userspace WireGuard device (wireguard-go, run by this process)
// stops: its interface, and the routes through it, go away.
func (r *Reconciler) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h != nil {
		r.h.Close()
		r.h = nil
	}
	if r.dump != nil {
		r.dump.Close()
		r.dump = nil
	}
	if r.wg != nil {
		_ = r.wg.Close() // a userspace device stops with it
		r.wg = nil
	}
	r.wgWant = nil
	r.base = nil
	return nil
}
