// Package overlay reconciles the kernel state that carries pod traffic
// between Village nodes: one VXLAN or WireGuard device per network, and per
// peer node a route for each of its pod subnets plus, for VXLAN, one
// neighbour entry and one FDB entry (for WireGuard, one peer of the device).
//
// # Packet paths
//
// host-gw. A pod on node A sends to a pod on node B; A's routing table has
//
//	10.244.2.0/24 via 192.168.77.12 dev eth0 proto 86
//
// so the packet leaves unchanged on the underlay, addressed (at L2) to B's
// underlay MAC, and B forwards it to its pod bridge. It only works when B's
// underlay address is on one of A's underlay subnets (same L2 segment), and
// when the pod subnet and B's underlay address are of the same family.
//
// vxlan. A's routing table has
//
//	10.244.2.0/24 via 10.244.2.0 dev village.1 onlink proto 86
//
// The gateway is B's VTEP address, by convention the network address of B's
// pod subnet (B carries it as a /32 or /128 on its own village.1, as flannel
// does). A permanent neighbour entry resolves that address to B's VTEP MAC
//
//	10.244.2.0 lladdr 0e:76:c0:a8:4d:0c dev village.1 PERMANENT
//
// and a permanent FDB entry tells the VXLAN driver where that MAC lives
//
//	0e:76:c0:a8:4d:0c dev village.1 dst 192.168.77.12 self permanent
//
// so the inner Ethernet frame is wrapped in UDP (port 4789 by default, VNI 1)
// to B's underlay address. B's village.1 has exactly that MAC (every node
// derives it the same way from its own underlay address, see [DeriveMAC]),
// decapsulates, and routes the inner packet to its pod bridge. Learning is
// off and there is no flood entry: nothing is resolved at run time, every
// entry is written by this package. The device MTU is the underlay MTU less
// 50 (IPv4 underlay) or 70 (IPv6 underlay); pods should use the same MTU
// ([Report.MTU]).
//
// auto picks host-gw for a peer whose underlay address is on the underlay's
// L2 subnet and the pod subnet is of the same family, and vxlan otherwise
// (so IPv6 pods over an IPv4 underlay go over VXLAN). vxlan always keeps
// the device and reports its MTU for pods. auto keeps it only while at least
// one peer goes over VXLAN, and reports its MTU then, the underlay's
// otherwise: on one L2 segment there is no device and pods get the full
// MTU. The device comes and goes with Set only (Update answers ErrNeedSet to
// a change that needs it made or removed); [Reconciler.PodMTU] is what a pod
// added now gets. auto assumes the nodes agree on who is on-link (one prefix
// length per segment): a node that sees a peer on-link sends it plain
// packets and has no device to receive that peer's VXLAN.
//
// wireguard. A's routing table has
//
//	10.244.2.0/24 dev villagewg.51820 proto 86
//
// and the WireGuard device (the kernel's, or wireguard-go run by the
// agent, package wireguard) has B as a peer: B's public key, B's endpoint
// (its underlay address at the port, or the endpoint B published) and as
// allowed IPs B's pod subnets. The device encrypts the packet and sends it
// in UDP to B's endpoint; B decrypts it, checks that its source is one of
// A's allowed IPs and routes it to its pod bridge. A peer without a public
// key gets no route and no peer entry (ErrNoKey): its pods are unreachable
// from here, and nothing is ever sent to them in the clear. The device
// carries the network address of each own pod subnet, as the VXLAN device
// does, so what the node itself sends to a peer's pods has a source the
// peer accepts. Its MTU, and the pods', is the underlay's less 60 (IPv4
// underlay: IP 20, UDP 8, WireGuard header 16, authentication tag 16) or
// 80 (IPv6 underlay: IP 40). The peer list is set from the same plan as
// the routes, before them, on every Set; Update answers ErrNeedSet.
//
// IPv4 and IPv6 pod subnets and underlays go through the same code: an
// address family only changes the VTEP address length, the MTU overhead and
// the kernel's default route metric.
//
// # What is owned
//
//   - routes in the main table carrying protocol [RouteProtocol] (86, 'V')
//     and the network's metric ([Metric] of [Config.Network]): routes of
//     other protocols and of other networks are never changed or deleted,
//     and someone else's route at a peer route's destination that the
//     kernel would prefer (metric no higher) is reported as a conflict
//     (ErrConflict) rather than replaced;
//   - the device village.<vni> when it carries the network's alias
//     ([Alias]), its addresses, and every permanent neighbour and FDB entry
//     on it. A device with another network's alias is a conflict (the pass
//     stops before writing anything); one without an alias (made before
//     devices had one) is taken over by a network that needs a device and
//     left alone by the others, as are routes with protocol 86 and the
//     kernel's default metric unless they go where this network routes.
//
// # Reconciling and repairing drift
//
// The kernel is the only state [Reconciler.Set] trusts: every Set
// computes the desired objects from (self, peers) (or takes the plan the
// last successful Set or Update made for exactly these inputs and the same
// underlay: see [Reconciler.Update] for that baseline), reads what the kernel
// has with one dump per kind (routes per family, neighbours, FDB), and applies the
// difference: additions and replacements first (FDB and neighbours before
// the routes that use them), then deletions of what is no longer wanted.
// Nothing is written when nothing differs, so Set is cheap enough for every
// CNI ADD and CHECK, and a hand-deleted route, neighbour or FDB entry is put
// back by the next Set. An agent that follows the kernel's notifications
// repairs one object without a pass: [Reconciler.Drifts] judges a
// notification against the plan, and [Reconciler.Repair] puts the objects
// the drifting ones name back as the plan has them, through the same
// engine and with nothing read back, leaving the kernel a Set would
// leave (a link or address change needs Set). [Reconciler.Status] runs exactly the same
// computation without writing and returns the changes Set would make.
// [Reconciler.Teardown] removes everything owned.
//
// Errors never stop the pass: each failed object is reported in
// [Report.Failed] and in the returned error (errors.Join of %w-wrapped
// errors that name the object and its peer), and everything else is still
// applied. A peer whose plan is invalid (host-gw to an off-subnet peer, a
// duplicate pod subnet) has its existing kernel objects left alone.
package overlay
