// Package agent is `villaged`: the node agent that keeps this node's entry
// in the cluster's node registry and this node's kernel in step with every
// other node's entry, plus the one-shot `sync` and the read-only `status`.
//
// # What run does, in order
//
//  1. Reads the village entry of the conflist (Load), opens the node's
//     registry (source.go: etcd, or the kubernetes registry through the
//     Kubernetes side) and, with the wireguard backend, loads its key and
//     makes its rotator (wgrotate.go).
//  2. When the config uses the Kubernetes API (the kubernetes registry, a
//     LAN section, networkPolicy): makes the one Kubernetes side (kube.go:
//     one client, one shared informer factory with the informers the
//     config turns on, one Event recorder) and starts its informers, the
//     only start; proves the API confinement (confine.go) for the
//     process's life, every write waiting for the proof. Serves the
//     metrics and the probes (health.go) when asked to.
//  3. Starts the early features (feature.go), which need neither the
//     underlay address nor the pod subnet: the LAN pods' DHCP client
//     (dhcp.go), the LAN pods' answers and the DHCP requests on the one
//     agent socket with the LAN pool's host credentials (lanside.go,
//     hostcreds.go), Services on the LAN (lansvc.go, pkg/lansvc).
//  4. Waits for the underlay address (the underlay interface's first
//     global address, IPv4 first) and the pod subnets: the IPAM ranges of
//     the conflist, else a subnet leased out of clusterCIDR in etcd
//     (registry.LeaseSubnet: the one it already holds if any, otherwise
//     the first free one, taken with a compare-and-set) or the Node's
//     spec.podCIDRs, published atomically in <run dir>/<network>/subnet
//     (/run/village by default, --run-dir or $VILLAGE_RUN_DIR to move it,
//     ipam.subnetFile to name the file), where village-ipam reads it. So
//     one conflist serves every node. Then publishes the conflist when
//     asked to (the node can network pods).
//  5. Starts the nftables watch (nftables.go) and the late features:
//     NetworkPolicy (netpol.go, pkg/netpol/controller), the masquerade
//     keeper (masquerade.go) and, last, the overlay (overlay.go), whose
//     Start starts the kernel watch (kernel.go), 6 and 7.
//  6. Registers {name, ip, podCIDRs, vtepMAC} (under an etcd lease of the
//     configured TTL, or as annotations on its Node) and follows the
//     registry: a list at one revision, then a watch from the next,
//     through a registry.Feed that hands the loop the whole list first and
//     then only the records that changed (coalesced while the loop is
//     busy), so an event costs the same with 10 nodes or 5,000.
//  7. Runs the loop, which owns the overlay: the first list with
//     overlay.Set(self, peers), every later batch with overlay.Update and
//     the change overlay.Diff finds between the old and new records of the
//     names the batch holds (Set again when Update cannot). The first Set,
//     made only once the first list has arrived, is also the sweep of
//     whatever a previous run left that is no longer wanted: nothing is
//     ever reconciled against a view the agent does not have, so an
//     unreachable etcd at start leaves the kernel as it was. After it the
//     loop asks the masquerade keeper for a pass. With static peers and no
//     registry, the overlay's Start makes the first Set itself.
//
// Run then waits for its context; the features' goroutines are in its
// wait groups.
//
// # Features
//
// Everything run runs is a feature (feature.go), started and reported
// through one small interface: Name, Start (its goroutines in the run's
// wait group, until the run's context is done; it returns once what it
// serves exists; an error is a configuration that cannot work and stops
// run) and Status (`villaged status`'s lines, read from the view status
// reads, the kernel, the run directory and the agent socket, and whether
// it is what it should be). The features, in the order status reports
// them:
//
//   - overlay (overlay.go): the routes, neighbour and FDB entries (or
//     WireGuard peers) toward every peer; its Start starts the kernel
//     watch, the registry's follower and keeper, and the loop, the
//     reconciler's one caller; its Status is the device, the node, its
//     registration and each peer;
//   - masquerade (masquerade.go): the netfilter rules (masquerade, forward
//     accept, macspoofchk) through masq.Keep, in one keeper goroutine
//     woken by the nftables notifications and by the loop (keep);
//   - DHCP (dhcp.go): the LAN pods' leases;
//   - LAN pods (lanside.go): the agent socket's answers;
//   - LAN Services (lansvc.go, pkg/lansvc);
//   - NetworkPolicy (netpol.go, pkg/netpol/controller).
//
// A feature the config leaves off starts nothing. A feature is handed the
// agent and takes only what it uses: the config, the Kubernetes side's
// informers, client and recorder (never the factory), the metrics, and
// what the features started before it made (the DHCP client for the agent
// socket, the LAN pods' controller for NetworkPolicy, the masquerade
// keeper for the overlay's loop).
//
// # The kubernetes registry
//
// With backend.registry.type "kubernetes" the steps are the same with the
// API server in etcd's place (package kuberegistry): the pod subnets are the
// Node's spec.podCIDRs (a Node without any yet is a log line and a retry
// every 2 s), the registration is two village.cni.io/ annotations on the
// Node, and the follower is a Node informer. Both registries implement
// source, so run, sync and status do not tell them apart past Load.
//
// # Events, the safety net and the tick
//
// Run reacts to events; a timer only backs them up.
// The events are the registry watch (a node joined, changed, or its lease
// expired and etcd deleted its record) and the kernel's own notifications
// of routes, neighbour and FDB entries, addresses and links, each judged
// against the reconciler's plan (overlay.Reconciler.Drifts): a planned
// object deleted or changed, someone else's route in front of a planned
// one, a stray entry of this network, the VXLAN device or the underlay
// link changed (a changed underlay address is registered again). The
// agent's own writes are the plan, so they start nothing.
//
// Kernel events are coalesced for settle (10 ms). A notification about
// one route, neighbour or FDB entry is repaired as that object
// (overlay.Reconciler.Repair: compared with the plan the reconciler holds,
// no planning, no dump); one about a link or an address, someone else's
// route, or more objects than the watcher queues starts a full pass (Set),
// as does anything Repair cannot judge alone; the VXLAN device is made
// right first, on its own (overlay.Reconciler.RepairDevice), since the
// full pass that puts its peers' entries back takes a while at thousands
// of peers. The device deleted or set down is not coalesced: every peer's
// traffic stops with it, so its notification starts that repair at once.
// A deleted device's entries are announced before the device itself (the
// kernel flushes them first); a repair of them that finds the device gone
// (overlay.ErrDeviceGone) makes the device first too. Notifications about the
// node's own objects (a host-shim route, an address while there is a host
// shim, a host veth's MAC) run repairLocal.
//
// The network's own nftables tables (the masquerade tables, iptables-nft's
// nat and filter tables where the iptables backend's rules live, and with
// networkPolicy the policy and pending tables) are followed through the
// kernel's nf_tables notifications (nftables.go, pkg/nftwatch): a change
// to one wakes the masquerade keeper (masq.Keep) or the policy
// controller's repair, which write nothing when the kernel holds what
// they want.
//
// Nothing periodic does what notifications cover. The safety net
// (Options.SafetyNet, 5 min by default, each wait jittered between 0.8
// and 1.2 of it) is a full pass and a masquerade pass, for what no notification
// says (one lost by the kernel, a change made silently); it is also the
// policy controller's repair period and the kubernetes registry's resync.
// The tick (Period, 10 s) does the time-based work only: held peers,
// reclaims, metrics, and a masquerade pass on a legacy-iptables host
// (x_tables sends no notification); and a full pass on every tick while the kernel
// watch is not whole (a subscription failed, or ended on a full socket
// buffer and notifications may be lost; it is made again after a pause)
// or the last pass failed. Set writes nothing when nothing differs.
//
// # Who owns what
//
// Each piece of the loop's state has one goroutine that owns it, and
// everything else reaches it through channels:
//
//   - the follower (registry.Follow) owns the node map and sends copies;
//   - the keeper owns the registration (lease id, record): it renews the
//     lease every TTL/3, rewrites a record deleted by hand, registers anew
//     when the lease was lost, and takes new records (address changed) from
//     a latest-value channel;
//   - the kernel watcher owns the netlink subscriptions and sends a
//     coalescing signal; the single objects to repair go through a
//     channel, what needs a full pass or repairLocal and whether it has
//     seen everything since the last tick are atomics the loop reads
//     (kernel.go);
//   - the loop owns self, the peer view and the timers, and is the only
//     caller of the reconciler (which serializes anyway);
//   - the masquerade keeper owns the netfilter rules' passes: one
//     masq.Keep at a time, one request queued behind it.
//
// Three small values are written by one goroutine and read by another,
// each behind its own lock: the health the probes report (health.go), the
// confinement proof the writes wait for (confine.go) and what the keeper
// knows of this node's lease (outage.go). The features own their own
// state (their packages).
//
// # Stopping
//
// On SIGTERM or SIGINT (the context of Run is cancelled) the goroutines stop
// and Run returns. Routes, neighbour and FDB entries stay, so pods keep
// talking while the agent is upgraded or restarted, and the lease is NOT
// revoked: it expires by itself after its TTL unless the agent is back
// before then. A node that is gone for good thus disappears from every
// other node one TTL after its agent stopped. Its subnet lease stays (it
// has no TTL) until released, or until the surviving agents reclaim it with
// its LAN-pool allocations once it has been gone for registry.reclaimAfter
// (reclaim.go; registry.Reclaim makes that one agent, once).
//
// # Several networks, other plugins
//
// Each network's agent touches only its own kernel objects: overlay routes
// with its metric, its VXLAN device (alias), its host-shim routes (metric)
// and the host veths on its bridge that carry Village's owner tag (their
// MACs are put back when something changed them). Pods another plugin made
// on the same bridge are reported by status as not Village's, never as
// orphans.
//
// # Errors
//
// Errors wrap with %w and name the object: the file, the interface, the
// etcd endpoints and key, the kernel object and peer. A failed pass is
// logged and retried by the next event or tick; only a configuration that
// can never work (no village entry, no registry and no static peers where
// one is needed, an invalid node name) stops run.
package agent
