package overlay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/wireguard"
)

const (
	// DefaultWireGuardPort is the WireGuard UDP port when Config.Port is 0
	// under ModeWireGuard (WireGuard's customary one).
	DefaultWireGuardPort = 51820
	// WireGuardDevicePrefix starts the WireGuard device's name:
	// villagewg.<port>.
	WireGuardDevicePrefix = "villagewg."

	// The WireGuard data packet around an inner IP packet: outer IPv4 20
	// (IPv6 40) + UDP 8 + WireGuard header 16 (type, receiver index,
	// counter) + Poly1305 tag 16. Padding to a multiple of 16 eats into
	// this MTU, never beyond it.
	wgOverhead4 = 60
	wgOverhead6 = 80
)

// ErrNoKey is wrapped by the problem reported for a peer without a
// WireGuard public key under ModeWireGuard: the peer is not routed, so its
// pods are unreachable from here, but nothing goes to it in the clear.
var ErrNoKey = errors.New("peer has no WireGuard public key: not routed (never in the clear)")

// WireGuardConfig is the device side of ModeWireGuard.
type WireGuardConfig struct {
	// KeyFile holds this node's private key (wireguard.LoadOrCreateKey:
	// made on first use, root-only).
	KeyFile string
	// PersistentKeepalive is the keepalive interval given to every peer; 0
	// sends none.
	PersistentKeepalive time.Duration
	// Userspace is wireguard.UserspaceAuto ("" too), UserspaceNever or
	// UserspaceAlways.
	Userspace string
	// Hubs names nodes that relay (as Node.WireGuardHub says of a peer):
	// the etcd registry's way to name them.
	Hubs []string
	// Logf receives wireguard-go's error lines; nil drops them.
	Logf func(format string, args ...any) `json:"-"`
	// Start runs wireguard-go in this process when the policy asks for
	// it (pkg/wireguard/userspace.Start: villaged hands it over); nil
	// makes no userspace device, so the CNI plugin, which only reads the
	// device, links no wireguard-go.
	Start wireguard.StartUserspace `json:"-"`
}

func (w WireGuardConfig) validate(c Config) error {
	switch {
	case c.NetNS != "":
		return fmt.Errorf("%w: wireguard manages its device in the process's own network namespace, not %s", ErrConfig, c.NetNS)
	case w.KeyFile == "" || w.KeyFile[0] != '/':
		return fmt.Errorf("%w: wireguard key file %q (want an absolute path)", ErrConfig, w.KeyFile)
	case w.PersistentKeepalive < 0 || w.PersistentKeepalive > 65535*time.Second || w.PersistentKeepalive%time.Second != 0:
		return fmt.Errorf("%w: wireguard persistent keepalive %v (want whole seconds, 0-65535)", ErrConfig, w.PersistentKeepalive)
	}
	switch w.Userspace {
	case "", wireguard.UserspaceAuto, wireguard.UserspaceNever, wireguard.UserspaceAlways:
	default:
		return fmt.Errorf("%w: wireguard userspace %q (want auto, never or always)", ErrConfig, w.Userspace)
	}
	return nil
}

// WireGuardDeviceName is the WireGuard device of a listen port.
func WireGuardDeviceName(port int) string { return WireGuardDevicePrefix + strconv.Itoa(port) }

// WireGuardOverhead is what WireGuard adds to a packet over an underlay
// address of underlayIP's family: 60 bytes for IPv4, 80 for IPv6.
func WireGuardOverhead(underlayIP net.IP) int {
	if isV4(underlayIP) {
		return wgOverhead4
	}
	return wgOverhead6
}

// wgBackend: podCIDR dev villagewg.<port>, no gateway, no neighbour: the
// device picks the peer whose allowed IPs hold the destination.
type wgBackend struct{}

func (wgBackend) hop(e env, peer Node, cidr *net.IPNet) (hop, error) {
	if peer.WireGuardKey == (wgtypes.Key{}) {
		return hop{}, fmt.Errorf("peer %s (%s): %w", peer.Name, cidr, ErrNoKey)
	}
	return hop{route: route{peer: peer.Name, dst: cidr, link: e.wg}}, nil
}

// wgDevice is this network's WireGuard device name.
func (r *Reconciler) wgDevice() string { return WireGuardDeviceName(r.cfg.Port) }

// WireGuardPublicKey is this node's public key under ModeWireGuard (the
// key file is made on first use), for the registry to publish.
func (r *Reconciler) WireGuardPublicKey() (wgtypes.Key, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadWGKey(); err != nil {
		return wgtypes.Key{}, err
	}
	return r.wgKey.PublicKey(), nil
}

func (r *Reconciler) loadWGKey() error {
	if r.cfg.Mode != ModeWireGuard {
		return fmt.Errorf("%w: mode %s has no WireGuard key", ErrConfig, r.cfg.Mode)
	}
	if r.wgKey != (wgtypes.Key{}) {
		return nil
	}
	priv, _, err := wireguard.LoadOrCreateKey(r.cfg.WireGuard.KeyFile)
	if err != nil {
		return err
	}
	r.wgKey = priv
	return nil
}

func (r *Reconciler) wgObject(mtu int) Object {
	return Object{Kind: KindDevice, Desc: fmt.Sprintf("%s (wireguard listen-port %d mtu %d)", r.wgDevice(), r.cfg.Port, mtu)}
}

// ensureWG makes the WireGuard device (the kernel's or wireguard-go in this
// process, see package wireguard) with this node's key, the port and the
// underlay's MTU less the overhead, gives it the network's alias and, as
// the VXLAN device has, the network address of each own pod subnet, so
// that what the node itself sends to a peer's pods has a source the peer
// accepts. It returns the device (index 0 when dry and missing, or failed).
func (r *Reconciler) ensureWG(rc *recorder, u underlay, self Node) linkRef {
	name := r.wgDevice()
	ref := linkRef{name: name}
	mtu := u.mtu() - WireGuardOverhead(u.ip)
	link, err := r.h.LinkByName(name)
	if err != nil && !linkNotFound(err) {
		_ = rc.fail(Change{OpAdd, r.wgObject(mtu)}, fmt.Errorf("looking up device %s: %w", name, err))
		return ref
	}
	if link != nil && link.Attrs().Alias != "" && link.Attrs().Alias != r.alias() {
		_ = rc.fail(Change{OpAdd, r.wgObject(mtu)}, fmt.Errorf("device %s belongs to another network (alias %q); give network %q its own port: %w",
			name, link.Attrs().Alias, r.cfg.Network, ErrConflict))
		return ref
	}
	if rc.dry {
		if link == nil {
			_ = rc.do(Change{OpAdd, r.wgObject(mtu)}, nil)
			return ref
		}
		if link.Attrs().MTU != mtu {
			_ = rc.do(Change{OpReplace, Object{Kind: KindDevice, Desc: fmt.Sprintf("%s mtu %d (was %d)", name, mtu, link.Attrs().MTU)}}, nil)
		}
		ref.index = link.Attrs().Index
		return ref
	}
	if err := r.loadWGKey(); err != nil {
		_ = rc.fail(Change{OpAdd, r.wgObject(mtu)}, fmt.Errorf("device %s: %w", name, err))
		return ref
	}
	ensure := func() error {
		dev, err := wireguard.Ensure(wireguard.DeviceConfig{
			Name: name, PrivateKey: r.wgKey, ListenPort: r.cfg.Port, MTU: mtu,
			Userspace: r.cfg.WireGuard.Userspace, Logf: r.cfg.WireGuard.Logf, Start: r.cfg.WireGuard.Start,
		})
		if err == nil {
			if r.wg != nil && r.wg != dev {
				_ = r.wg.Close() // a kernel device's client; a userspace one is dev again
			}
			r.wg = dev
		}
		return err
	}
	switch {
	case link == nil:
		err = rc.do(Change{OpAdd, r.wgObject(mtu)}, ensure)
	case link.Attrs().MTU != mtu:
		err = rc.do(Change{OpReplace, Object{Kind: KindDevice, Desc: fmt.Sprintf("%s mtu %d (was %d)", name, mtu, link.Attrs().MTU)}}, ensure)
	default:
		if err = ensure(); err != nil {
			err = rc.fail(Change{OpReplace, r.wgObject(mtu)}, fmt.Errorf("device %s: %w", name, err))
		}
	}
	if err != nil {
		return ref
	}
	if link, err = r.h.LinkByName(name); err != nil {
		_ = rc.fail(Change{OpAdd, r.wgObject(mtu)}, fmt.Errorf("looking up device %s: %w", name, err))
		return ref
	}
	ref.index = link.Attrs().Index
	if link.Attrs().Alias != r.alias() {
		c := Change{OpReplace, Object{Kind: KindDevice, Desc: fmt.Sprintf("%s alias %q", name, r.alias())}}
		_ = rc.do(c, func() error { return r.h.LinkSetAlias(link, r.alias()) })
	}
	if r.isHub(self) {
		// A hub routes relayed pod traffic from its device back into it,
		// even with no pod of its own (which is what turns forwarding on
		// elsewhere).
		var ips []net.IP
		for _, c := range self.PodCIDRs {
			ips = append(ips, c.IP)
		}
		if err := netsetup.EnableForwarding(ips); err != nil {
			_ = rc.fail(Change{OpReplace, Object{Kind: KindDevice, Desc: name + " forwarding (wireguard hub)"}}, err)
		}
	}
	s := vtepSpec{name: name}
	for _, c := range self.PodCIDRs {
		s.addrs = append(s.addrs, vtepAddr(canonical(c)))
	}
	r.fixVTEPAddrs(rc, s, link)
	return ref
}

// wgPeers is the device's peer list for plan d: every peer that has a route
// in it, with the route's destinations as allowed IPs. Its endpoint is the
// one it published, else its underlay address at this network's port. A
// hub peer is marked so (the device may relay through it, see package
// wireguard), unless self is a hub: a hub reaches every peer directly.
func (r *Reconciler) wgPeers(d desired, self Node, peers []Node) []wireguard.Peer {
	byName := make(map[string]Node, len(peers))
	for _, p := range peers {
		if _, ok := byName[p.Name]; !ok {
			byName[p.Name] = p
		}
	}
	allowed := map[string][]net.IPNet{}
	for _, rt := range d.routes {
		allowed[rt.peer] = append(allowed[rt.peer], *rt.dst)
	}
	selfHub := r.isHub(self)
	out := make([]wireguard.Peer, 0, len(allowed))
	for name, nets := range allowed {
		n := byName[name]
		ep := n.WireGuardEndpoint
		if ep == nil {
			ep = &net.UDPAddr{IP: n.IP, Port: r.cfg.Port}
		}
		out = append(out, wireguard.Peer{PublicKey: n.WireGuardKey, Endpoint: ep, AllowedIPs: nets,
			PersistentKeepalive: r.cfg.WireGuard.PersistentKeepalive, Hub: !selfHub && r.isHub(n)})
	}
	return out
}

// isHub tells whether node n relays: its record says so, or the config
// names it.
func (r *Reconciler) isHub(n Node) bool {
	return n.WireGuardHub || slices.Contains(r.cfg.WireGuard.Hubs, n.Name)
}

// setWGPeers makes the device's peer list the plan's (see wgPeers); dry,
// it reports whether it differs. The list is kept for RefreshWireGuardPaths.
func (r *Reconciler) setWGPeers(rc *recorder, wg linkRef, d desired, self Node, peers []Node) {
	if wg.index == 0 {
		return // no device: its own failure (or dry add) is reported
	}
	want := r.wgPeers(d, self, peers)
	dev := r.wg
	if dev == nil { // dry, from a reconciler that never made it: read it
		var err error
		if dev, err = wireguard.Open(wg.name); err != nil {
			_ = rc.fail(Change{OpReplace, r.wgPeersObject(wg.name, want)}, err)
			return
		}
		defer dev.Close()
	}
	if !rc.dry {
		r.wgWant = want
	}
	r.writeWGPeers(rc, dev, wg.name, want)
}

func (r *Reconciler) wgPeersObject(name string, want []wireguard.Peer) Object {
	return Object{Kind: KindDevice, Desc: fmt.Sprintf("%s peers (%d)", name, len(want))}
}

// writeWGPeers gives dev the peer list want, when it differs.
func (r *Reconciler) writeWGPeers(rc *recorder, dev *wireguard.Device, name string, want []wireguard.Peer) {
	obj := r.wgPeersObject(name, want)
	n, err := dev.PeerChanges(want)
	if err != nil {
		_ = rc.fail(Change{OpReplace, obj}, err)
		return
	}
	if n == 0 {
		return
	}
	_ = rc.do(Change{OpReplace, obj}, func() error { _, err := dev.SetPeers(want); return err })
}

// WireGuardPaths tells whether some peer's path through the WireGuard
// device may change with the clock alone (pending: a peer that has not
// handshaken yet while a hub could relay it, or one relayed through a
// hub; see package wireguard), and whether there are hubs at all
// (watched: a direct session that dies would be relayed). The agent calls
// RefreshWireGuardPaths often while pending, now and then while watched.
func (r *Reconciler) WireGuardPaths() (pending, watched bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wg == nil || r.wgWant == nil {
		return false, false
	}
	return r.wg.PathsPending()
}

// RefreshWireGuardPaths writes the last Set's peer list to the device
// again, so that peers move to or from a hub as their handshakes say,
// without planning or reading anything else. Nothing happens before a
// Set made the device.
func (r *Reconciler) RefreshWireGuardPaths(ctx context.Context) (Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wg == nil || r.wgWant == nil {
		return Report{}, nil
	}
	rc := &recorder{ctx: ctx}
	r.writeWGPeers(rc, r.wg, r.wg.Name(), r.wgWant)
	return Report{Applied: rc.applied, Failed: rc.failed}, rc.err()
}

// removeWG deletes this network's WireGuard device when present (and with
// it every route through it): the one this reconciler runs, or a link of
// that name carrying this network's alias.
func (r *Reconciler) removeWG(rc *recorder) {
	name := r.wgDevice()
	c := Change{OpDelete, Object{Kind: KindDevice, Desc: name}}
	if r.wg != nil {
		_ = rc.do(c, func() error {
			err := r.wg.Delete()
			r.wg, r.wgWant = nil, nil
			return err
		})
		return
	}
	link, err := r.h.LinkByName(name)
	if err != nil || link.Attrs().Alias != r.alias() {
		return
	}
	_ = rc.do(c, func() error { return ignoreGone(r.h.LinkDel(link)) })
}

// RotateWireGuardKey gives this node a new WireGuard key: the device (when
// this reconciler runs it) takes the new private key first, then the key
// file, so that what the agent publishes next (the returned public key) is
// the key the device already has (see package wireguard, "Rotating the
// key"). A failure leaves the old key in place, device and file.
func (r *Reconciler) RotateWireGuardKey() (wgtypes.Key, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadWGKey(); err != nil {
		return wgtypes.Key{}, err
	}
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("generating a WireGuard key: %w", err)
	}
	if r.wg != nil {
		if err := r.wg.SetPrivateKey(k); err != nil {
			return wgtypes.Key{}, err
		}
	}
	if err := wireguard.ReplaceKey(r.cfg.WireGuard.KeyFile, k); err != nil {
		if r.wg != nil {
			err = errors.Join(err, r.wg.SetPrivateKey(r.wgKey))
		}
		return wgtypes.Key{}, err
	}
	r.wgKey = k
	return k.PublicKey(), nil
}
