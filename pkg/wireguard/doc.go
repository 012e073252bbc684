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
// # Rotating the key
//
// A node changes its key ([Device.SetPrivateKey], then [ReplaceKey]) and
// only then publishes the new public key; each peer, when it reads it,
// replaces the node's peer entry in one configuration ([Device.SetPeers]:
// the new key takes the pod subnets over, the old entry goes). The order
// is forced by what WireGuard (the kernel's and wireguard-go, both driven
// through wgctrl) allows, and it is what loses no packet:
//
//   - A device has one private key, and a peer's allowed IPs belong to one
//     public key on each side: the same entry picks the peer for an
//     outgoing packet and checks the inner source of an incoming one. So
//     no moment lets both keys carry the same pod subnet; a second device
//     on a second port with the new key would need every peer to move its
//     entry, and the node to move its routes peer by peer, at the same
//     instant, and would change the published port.
//   - A device whose private key changes keeps the sessions it has for
//     receiving: what peers still send under the old key decrypts, so the
//     peers' traffic to the node goes on, with the old key, until each one
//     replaces the entry. What the node sends waits in the peer's staged
//     queue (128 packets per peer in both implementations) while a
//     handshake under the new key is tried: the one the node starts is
//     refused until the peer knows the key, and the peer, on replacing the
//     entry, starts one itself (a peer entry with a persistent keepalive
//     sends one when it is made: at once, or quietFor later when the
//     peer's key is the higher, see speak.go), after which the queue goes
//     out. The wait is the time the registry takes to bring the new key to
//     the peer, plus at most quietFor; with persistentKeepalive 0 the
//     node's next try, five seconds on, completes it instead.
//   - Publishing first would be worse: a peer that took the new key before
//     the node had it would drop the node's packets under the old key (the
//     entry they belong to is gone) and its handshakes would reach a
//     device that cannot read them.
//
// After the rotation nothing accepts the old key: every peer's entry for it
// is gone, so a handshake made with the old private key, by whoever holds
// it, is dropped unanswered.
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
// stale peer stays. A peer marked [Peer.Hub] may carry the pod subnets of
// peers this device cannot reach directly (two nodes each behind its own
// NAT): see relay.go.
//
// Routing is not this package's: the caller routes each peer's pod subnets
// through the device.
package wireguard
