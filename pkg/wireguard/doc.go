// Package wireguard gives a Village node a WireGuard device to carry pod
// traffic to its peers encrypted.
//
// # Keys
//
// Each node has one Curve25519 private key, kept in a file only root can
// read ([LoadOrCreateKey]): made on first start and read on every later
// one, so a node's public key, the one its peers are configured with,
// survives agent restarts and upgrades. Only the public key leaves the
// node: peers are configured with it.
//
// # The device
//
// [Ensure] makes one WireGuard interface per network, in the network
// namespace the calling process runs in. Where the kernel has WireGuard
// (Linux 5.6 and later, or the module) it is a netlink link of kind
// "wireguard"; where it has not, it is wireguard-go, the userspace
// implementation, running inside this process on a TUN device. The policy
// [DeviceConfig.Userspace] chooses: auto takes the kernel's when the kernel
// can make the link and falls back to wireguard-go otherwise, never
// insists on the kernel's, always insists on wireguard-go.
//
// Both kinds are then configured the same way, through wgctrl: a kernel
// device over generic netlink, a userspace one over its UAPI socket
// /var/run/wireguard/<name>.sock, which pkg/wireguard/userspace serves for
// the wireguard-go devices it runs, exactly as the wireguard-go command
// does. wireguard-go itself is linked only by a process that hands
// userspace.Start to Ensure ([DeviceConfig.Start]): villaged does, the CNI
// plugin, which only reads a device's state, does not.
// That same socket lets `wg show` read either kind. A userspace device ends
// with its process: the TUN closes and the kernel removes the interface and
// every route through it, and nothing is sent in the clear meanwhile,
// because nothing routes to the underlay instead.
//
// # Peers
//
// [Device.SetPeers] is declarative: the list it is given becomes the
// device's whole peer list. Each peer is a public key, the underlay
// endpoint its packets go to, and its allowed IPs: the peer's pod subnets,
// which WireGuard uses both to pick the peer for an outgoing packet and to
// drop an incoming packet whose inner source the sending peer may not use.
// Peers that already match are left alone, so established sessions are
// not restarted; the rest is written in one configuration with additions
// before removals, so that when a node comes back with a new key the new
// peer takes the pod subnets over before the old one is removed, and no
// stale peer stays.
//
// Routing is not this package's: the caller routes each peer's pod subnets
// through the device.
package wireguard
