package wireguard

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Userspace policies: when Ensure uses the kernel's WireGuard and when
// wireguard-go.
const (
	UserspaceAuto   = "auto"   // the kernel's when it can make the device, wireguard-go otherwise
	UserspaceNever  = "never"  // the kernel's or an error
	UserspaceAlways = "always" // wireguard-go even where the kernel has WireGuard
)

// ErrNoKernel is wrapped by Ensure's error when the policy is "never" and
// the kernel cannot make a WireGuard device (no module).
var ErrNoKernel = errors.New("the kernel has no WireGuard support")

// ErrInUse is wrapped by Ensure's error when the name is taken by a link
// that is not a WireGuard device this process can manage.
var ErrInUse = errors.New("interface name in use")

// DeviceConfig is what Ensure makes a device have.
type DeviceConfig struct {
	Name       string      // interface name, at most 15 bytes
	PrivateKey wgtypes.Key // see LoadOrCreateKey
	ListenPort int         // UDP port the device receives on (1-65535)
	MTU        int         // 0: leave the device's (1420 when made)
	Userspace  string      // UserspaceAuto ("" too), UserspaceNever, UserspaceAlways
	// Logf receives wireguard-go's error lines and the reason auto fell back to
	// userspace; nil drops them.
	Logf func(format string, args ...any)
	// Start runs a wireguard-go device in this process
	// (pkg/wireguard/userspace.Start, which villaged hands over); nil
	// means this process makes none: a kernel device or an error.
	Start StartUserspace
}

// Userspace is a wireguard-go device this process runs
// (*userspace.Device). An alias of an unnamed interface, so that
// pkg/wireguard/userspace.Start is a StartUserspace without importing
// this package (whose tests import it).
type Userspace = interface {
	Up() error
	Close()
}

// StartUserspace starts a wireguard-go device on a new TUN called name.
type StartUserspace func(name string, mtu int, logf func(format string, args ...any)) (Userspace, error)

// ErrNoUserspace is wrapped by Ensure's error when a wireguard-go device
// is needed and the caller gave no DeviceConfig.Start.
var ErrNoUserspace = errors.New("this process runs no wireguard-go")

// Peer is one remote node as the device should know it.
type Peer struct {
	PublicKey           wgtypes.Key
	Endpoint            *net.UDPAddr // nil: learnt when the peer sends first
	AllowedIPs          []net.IPNet  // the peer's pod subnets
	PersistentKeepalive time.Duration
	// Hub: the peer relays, between peers that cannot reach each other,
	// the traffic of those whose subnets this device puts on its entry
	// (see relay.go).
	Hub bool
}

// Device is a WireGuard interface in the current network namespace, made
// by Ensure.
type Device struct {
	name   string
	client *wgctrl.Client
	us     Userspace // nil for a kernel device
}

// running holds the userspace devices of this process by name: Ensure
// returns the same one until it is closed.
var (
	runningMu sync.Mutex
	running   = map[string]*Device{}
)

const defaultMTU = 1420

// Ensure makes the device cfg names exist (or takes the existing one),
// gives it the private key and listen port, sets its MTU and brings it up.
// It is idempotent: a second call with the same config changes nothing,
// and one with another key, port or MTU changes just that. Peers are set
// with SetPeers. A userspace device lives as long as this process (or
// until Close): Ensure returns the same *Device for it each time, so its
// callers share it.
func Ensure(cfg DeviceConfig) (*Device, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	runningMu.Lock()
	defer runningMu.Unlock()
	_, existed := running[cfg.Name]
	d, err := cfg.device()
	if err != nil {
		return nil, err
	}
	if err := d.configure(cfg); err != nil {
		if d.us != nil && !existed {
			_ = d.closeLocked()
		}
		return nil, err
	}
	return d, nil
}

func (cfg *DeviceConfig) check() error {
	if cfg.Name == "" || len(cfg.Name) > unix.IFNAMSIZ-1 || strings.ContainsAny(cfg.Name, "/ \t\n:") {
		return fmt.Errorf("wireguard: invalid interface name %q (1-15 bytes, no '/', ':' or spaces)", cfg.Name)
	}
	if cfg.ListenPort < 1 || cfg.ListenPort > 65535 {
		return fmt.Errorf("wireguard: listen port %d out of range 1-65535", cfg.ListenPort)
	}
	if cfg.MTU != 0 && (cfg.MTU < 576 || cfg.MTU > 65535) {
		return fmt.Errorf("wireguard: MTU %d out of range 576-65535", cfg.MTU)
	}
	if cfg.PrivateKey == (wgtypes.Key{}) {
		return fmt.Errorf("wireguard: no private key")
	}
	switch cfg.Userspace {
	case "":
		cfg.Userspace = UserspaceAuto
	case UserspaceAuto, UserspaceNever, UserspaceAlways:
	default:
		return fmt.Errorf("wireguard: userspace policy %q is none of auto, never, always", cfg.Userspace)
	}
	return nil
}

func (cfg DeviceConfig) logf(format string, args ...any) {
	if cfg.Logf != nil {
		cfg.Logf(format, args...)
	}
}

// device finds or makes the device (runningMu held).
func (cfg DeviceConfig) device() (*Device, error) {
	link, err := netlink.LinkByName(cfg.Name)
	if err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, fmt.Errorf("wireguard: looking up %s: %w", cfg.Name, err)
	}
	own := running[cfg.Name]
	if own != nil && (link == nil || link.Type() != "tuntap") {
		// Someone deleted our TUN: the wireguard-go device is dead.
		_ = own.closeLocked()
		own = nil
	}
	switch {
	case own != nil && cfg.Userspace == UserspaceNever:
		return nil, fmt.Errorf("wireguard: %s is a userspace device but the policy is never: %w", cfg.Name, ErrInUse)
	case own != nil:
		return own, nil
	case link != nil && link.Type() == "wireguard" && cfg.Userspace != UserspaceAlways:
		return newDevice(cfg.Name, nil)
	case link != nil:
		return nil, fmt.Errorf("wireguard: %s exists as a %s link that this process does not run: %w", cfg.Name, link.Type(), ErrInUse)
	}
	if cfg.Userspace != UserspaceAlways {
		err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: cfg.Name}})
		switch {
		case err == nil:
			return newDevice(cfg.Name, nil)
		case !errors.Is(err, unix.EOPNOTSUPP):
			return nil, fmt.Errorf("wireguard: making kernel device %s: %w", cfg.Name, err)
		case cfg.Userspace == UserspaceNever:
			return nil, fmt.Errorf("wireguard: making kernel device %s: %w (%v); the userspace policy never forbids wireguard-go", cfg.Name, ErrNoKernel, err)
		}
		cfg.logf("wireguard: the kernel cannot make %s (%v): using wireguard-go", cfg.Name, err)
	}
	return cfg.startUserspace()
}

func newDevice(name string, us Userspace) (*Device, error) {
	c, err := wgctrl.New()
	if err != nil {
		return nil, fmt.Errorf("wireguard: opening the control client: %w", err)
	}
	return &Device{name: name, client: c, us: us}, nil
}

// startUserspace runs wireguard-go on a new TUN device through cfg.Start
// (see pkg/wireguard/userspace), whose UAPI socket
// (/var/run/wireguard/<name>.sock) wgctrl, like the wg tool, configures
// and reads it through.
func (cfg DeviceConfig) startUserspace() (*Device, error) {
	if cfg.Start == nil {
		return nil, fmt.Errorf("wireguard: making %s: %w", cfg.Name, ErrNoUserspace)
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = defaultMTU
	}
	us, err := cfg.Start(cfg.Name, mtu, cfg.Logf)
	if err != nil {
		return nil, err
	}
	d, err := newDevice(cfg.Name, us)
	if err != nil {
		us.Close()
		return nil, err
	}
	running[cfg.Name] = d
	return d, nil
}

// configure sets key, port, MTU and up.
func (d *Device) configure(cfg DeviceConfig) error {
	cur, err := d.client.Device(d.name)
	if err != nil {
		return fmt.Errorf("wireguard: reading %s: %w", d.name, err)
	}
	var c wgtypes.Config
	if cur.PrivateKey != cfg.PrivateKey {
		c.PrivateKey = &cfg.PrivateKey
	}
	if cur.ListenPort != cfg.ListenPort {
		c.ListenPort = &cfg.ListenPort
	}
	if c.PrivateKey != nil || c.ListenPort != nil {
		if err := d.client.ConfigureDevice(d.name, c); err != nil {
			return fmt.Errorf("wireguard: configuring %s: %w", d.name, err)
		}
	}
	link, err := netlink.LinkByName(d.name)
	if err != nil {
		return fmt.Errorf("wireguard: looking up %s: %w", d.name, err)
	}
	if cfg.MTU != 0 && link.Attrs().MTU != cfg.MTU {
		if err := netlink.LinkSetMTU(link, cfg.MTU); err != nil {
			return fmt.Errorf("wireguard: setting the MTU of %s to %d: %w", d.name, cfg.MTU, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("wireguard: setting %s up: %w", d.name, err)
		}
	}
	if d.us != nil {
		// wireguard-go comes up on the TUN's up event; this makes it up
		// (and its UDP port bound) before Ensure returns.
		if err := d.us.Up(); err != nil {
			return fmt.Errorf("wireguard: bringing wireguard-go %s up: %w", d.name, err)
		}
	}
	return nil
}

// Open attaches to an existing WireGuard device (the kernel's, or a
// userspace one through its UAPI socket, whichever process serves it) to
// read or set its peers; its Close leaves the device as it is.
func Open(name string) (*Device, error) {
	d, err := newDevice(name, nil)
	if err != nil {
		return nil, err
	}
	if _, err := d.client.Device(name); err != nil {
		_ = d.client.Close()
		return nil, fmt.Errorf("wireguard: reading %s: %w", name, err)
	}
	return d, nil
}

// Name is the interface name.
func (d *Device) Name() string { return d.name }

// Userspace tells whether the device is wireguard-go's (a TUN this process
// serves) rather than the kernel's.
func (d *Device) Userspace() bool { return d.us != nil }

// Index is the interface index, for routes through the device.
func (d *Device) Index() (int, error) {
	link, err := netlink.LinkByName(d.name)
	if err != nil {
		return 0, fmt.Errorf("wireguard: looking up %s: %w", d.name, err)
	}
	return link.Attrs().Index, nil
}

// SetPrivateKey gives the device another private key (a key rotation). The
// device keeps its peers and, until they expire or the peer replaces
// them, the sessions it has: it still decrypts what a peer sends on them.
// What it sends next waits, queued per peer, for a handshake under the new
// key (see the package comment, "Rotating the key").
func (d *Device) SetPrivateKey(k wgtypes.Key) error {
	if k == (wgtypes.Key{}) {
		return fmt.Errorf("wireguard: %s: no private key", d.name)
	}
	if err := d.client.ConfigureDevice(d.name, wgtypes.Config{PrivateKey: &k}); err != nil {
		return fmt.Errorf("wireguard: setting the private key of %s: %w", d.name, err)
	}
	return nil
}

// Peers reads the device's peers as the kernel or wireguard-go has them.
func (d *Device) Peers() ([]wgtypes.Peer, error) {
	cur, err := d.client.Device(d.name)
	if err != nil {
		return nil, fmt.Errorf("wireguard: reading %s: %w", d.name, err)
	}
	return cur.Peers, nil
}

// SetPeers makes peers the device's whole peer list, and returns how many
// peers it added, changed or removed. Peers that already have exactly the
// wanted endpoint, allowed IPs and keepalive are not touched (their
// sessions go on), and a peer heard from within RoamFresh keeps the
// endpoint its packets came from; the others are written in one
// configuration, additions and changes before removals, so a pod subnet
// that moves from a removed peer to another (a node that got a new key)
// always has one. Two peers with one public key are an error and nothing
// is written. With a Hub among peers, a peer that cannot be reached
// directly has its allowed IPs on a hub's entry instead (see relay.go).
func (d *Device) SetPeers(peers []Peer) (int, error) {
	changes, hushed, err := d.peerChanges(peers, true)
	if err != nil || len(changes) == 0 {
		return 0, err
	}
	if err := d.client.ConfigureDevice(d.name, wgtypes.Config{Peers: changes}); err != nil {
		return 0, fmt.Errorf("wireguard: setting the peers of %s: %w", d.name, err)
	}
	keepQuiet(d.name, hushed, time.Now())
	return len(changes), nil
}

// PeerChanges is how many peers SetPeers(peers) would add, change or
// remove now, without writing anything.
func (d *Device) PeerChanges(peers []Peer) (int, error) {
	changes, _, err := d.peerChanges(peers, false)
	return len(changes), err
}

// peerChanges is the configuration that makes peers the device's peer
// list, and the new peers it adds without their keepalive (see speak.go:
// the writer starts their quiet time once they are written); write tells
// that it will be written.
func (d *Device) peerChanges(peers []Peer, write bool) ([]wgtypes.PeerConfig, []Peer, error) {
	want := make(map[wgtypes.Key]Peer, len(peers))
	for _, p := range peers {
		if _, dup := want[p.PublicKey]; dup {
			return nil, nil, fmt.Errorf("wireguard: %s: public key %s is listed twice", d.name, p.PublicKey)
		}
		if p.PublicKey == (wgtypes.Key{}) {
			return nil, nil, fmt.Errorf("wireguard: %s: a peer has no public key", d.name)
		}
		want[p.PublicKey] = p
	}
	dev, err := d.client.Device(d.name)
	if err != nil {
		return nil, nil, fmt.Errorf("wireguard: reading %s: %w", d.name, err)
	}
	cur := dev.Peers
	have := make(map[wgtypes.Key]wgtypes.Peer, len(cur))
	for _, p := range cur {
		have[p.PublicKey] = p
	}
	now := time.Now()
	want = d.placeSubnets(dev.PublicKey, want, have, write, now)
	// Changes that give a peer a subnet it lacks go first (their order by
	// key among themselves), then the others: a subnet that moves from one
	// entry to another (relayed, or back) always has one.
	var changes, losing []wgtypes.PeerConfig
	var hushed []Peer
	keys := make([]wgtypes.Key, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b wgtypes.Key) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		p := want[k]
		h, ok := have[k]
		ka, hush := quietKeepalive(d.name, dev.PublicKey, p, !ok, write, now)
		if hush {
			hushed = append(hushed, p)
		}
		p.PersistentKeepalive = ka
		roamed := ok && heardFrom(h, now)
		if ok && samePeer(h, p, roamed) {
			continue
		}
		ep := p.Endpoint
		if roamed {
			ep = nil // keep the endpoint its packets come from
		}
		c := wgtypes.PeerConfig{
			PublicKey:                   k,
			Endpoint:                    ep,
			PersistentKeepaliveInterval: &ka,
			ReplaceAllowedIPs:           true,
			AllowedIPs:                  p.AllowedIPs,
		}
		if ok && !gains(h, p) {
			losing = append(losing, c)
			continue
		}
		changes = append(changes, c)
	}
	changes = append(changes, losing...)
	for _, h := range cur {
		if _, ok := want[h.PublicKey]; !ok {
			changes = append(changes, wgtypes.PeerConfig{PublicKey: h.PublicKey, Remove: true})
		}
	}
	return changes, hushed, nil
}

// RoamFresh is how long after a peer's last handshake the device keeps
// the endpoint that peer's packets came from rather than the one given to
// SetPeers: WireGuard's REJECT_AFTER_TIME, after which the session is dead
// anyway. A peer behind NAT is reached at the address and port its NAT
// gave its handshakes and keepalives, which it cannot know to publish;
// while it keeps talking, its peers keep answering there.
const RoamFresh = 180 * time.Second

// heardFrom tells whether the device has a live session with h, whose
// endpoint is then where h's packets come from.
func heardFrom(h wgtypes.Peer, now time.Time) bool {
	return h.Endpoint != nil && !h.LastHandshakeTime.IsZero() && now.Sub(h.LastHandshakeTime) < RoamFresh
}

// samePeer tells whether the device's peer h is p already; with roamed its
// endpoint (learnt from its packets) counts as p's.
func samePeer(h wgtypes.Peer, p Peer, roamed bool) bool {
	if h.PersistentKeepaliveInterval != p.PersistentKeepalive {
		return false
	}
	if roamed {
		return slices.Equal(prefixSet(h.AllowedIPs), prefixSet(p.AllowedIPs))
	}
	if (h.Endpoint == nil) != (p.Endpoint == nil) ||
		(p.Endpoint != nil && (!h.Endpoint.IP.Equal(p.Endpoint.IP) || h.Endpoint.Port != p.Endpoint.Port)) {
		return false
	}
	return slices.Equal(prefixSet(h.AllowedIPs), prefixSet(p.AllowedIPs))
}

// gains tells whether p has an allowed IP the device's peer h lacks.
func gains(h wgtypes.Peer, p Peer) bool {
	had := prefixSet(h.AllowedIPs)
	for _, n := range prefixSet(p.AllowedIPs) {
		if _, ok := slices.BinarySearch(had, n); !ok {
			return true
		}
	}
	return false
}

func prefixSet(ips []net.IPNet) []string {
	s := make([]string, 0, len(ips))
	for _, n := range ips {
		ip := n.IP.Mask(n.Mask)
		if ip4 := ip.To4(); ip4 != nil && len(n.Mask) == net.IPv4len {
			ip = ip4
		}
		s = append(s, (&net.IPNet{IP: ip, Mask: n.Mask}).String())
	}
	slices.Sort(s)
	return slices.Compact(s)
}

// Close releases the device. A userspace device stops and its interface
// and UAPI socket go away (routes through it with them); a kernel device
// stays, with its peers, for the next Ensure (use Delete to remove it).
func (d *Device) Close() error {
	runningMu.Lock()
	defer runningMu.Unlock()
	return d.closeLocked()
}

func (d *Device) closeLocked() error {
	if d.us != nil {
		forgetQuiet(d.name)
		forgetPaths(d.name)
		if running[d.name] == d {
			delete(running, d.name)
		}
		d.us.Close()
		d.us = nil
	}
	return d.client.Close()
}

// Delete closes the device and removes its interface, kernel or userspace.
func (d *Device) Delete() error {
	userspace := d.Userspace()
	err := d.Close()
	if userspace {
		return err
	}
	link, lerr := netlink.LinkByName(d.name)
	if lerr == nil && link.Type() == "wireguard" {
		lerr = netlink.LinkDel(link)
	} else if errors.As(lerr, &netlink.LinkNotFoundError{}) {
		lerr = nil
	}
	return errors.Join(err, lerr)
}
