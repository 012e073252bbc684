// Package netpol compiles Kubernetes NetworkPolicy into nftables and keeps
// the kernel in step with what it compiled.
//
// Compile is pure: from the policies, every pod's labels and addresses, the
// namespaces' labels and the names of this node's pods it computes a
// Ruleset, the declarative model of one nftables table per network:
//
//	table inet village_policy-<network>            (written whole by table.Apply, changed by table.Update)
//	  map ingress4 / ingress6          pod address : jump ingress.<ns>.<pod>   (isolated pods only)
//	  map egress4 / egress6            pod address : jump egress.<ns>.<pod>
//	  set s4-<hash> / s6-<hash>        peers of one rule (pods' addresses, ipBlocks less their excepts), intervals
//	  chain forward  type filter hook forward priority filter; policy accept
//	    icmpv6 type nd-router-solicit..nd-redirect accept      (neighbour discovery keeps working)
//	    iifname <bridge> ip6 saddr fe80::/10 drop, … daddr …   (link-local: no set holds it)
//	    ct state established,related accept
//	    ip saddr vmap @egress4, ip6 saddr vmap @egress6
//	    ip daddr vmap @ingress4, ip6 daddr vmap @ingress6
//	  chain ingress.<ns>.<pod>
//	    ip saddr @s4-… tcp dport 80 return                     (one rule per peer set and port)
//	    limit rate 20/second burst 20 packets log prefix "village:in:<network>" group 22087   (a sample to NFLOG)
//	    counter name "in.<ns>/<pod>" drop                     (the exact count table.Drops reads)
//	  counter in.<ns>/<pod> / eg.<ns>/<pod>   the drop counter of each per-pod chain (an object: it outlives a refill)
//	table inet village_pending-<network>           (kept; ADD adds, Apply removes)
//	  set pending4 / pending6          addresses of new pods whose rules are not compiled yet
//	  chain forward  type filter hook forward priority filter - 5; policy accept
//	    icmpv6 type nd-router-solicit..nd-redirect accept
//	    iifname <bridge> ip6 saddr fe80::/10 drop, … daddr …
//	    ip saddr @pending4 drop, ip daddr @pending4 drop        (and ip6)
//
// # No window at a pod's start
//
// The agent lists the namespaces that hold a policy in
// <run dir>/<network>/policy-namespaces after each Apply. ADD of a pod in
// a listed namespace (the only pods a policy can select) adds the pod's
// addresses to the pending sets before it returns, that is before any
// container of the pod runs and before the address is published anywhere.
// Apply removes the marks of the pods it compiled in the same
// transaction that installs their rules, so a selected pod goes from "all
// dropped" to "its rules" with nothing in between, and an unselected pod of
// such a namespace waits only for the agent to see its address (the
// kubelet's status update, the watch, one compile). Pods of other
// namespaces are never marked: ADD reads a file and nothing else.
//
// # A change costs what it changes
//
// After the first apply, the agent installs each compile with
// table.Update, which diffs it against the last one and writes only the
// difference in one transaction: a pod that comes or goes is a few
// elements of the peer sets and verdict maps (and its chains), a policy
// change refills the chains of the pods it selects. Peer sets are named by
// the rule they come from, not by their content, precisely so that their
// membership changes are element updates. A failed apply or a drifted
// kernel is repaired by writing the whole table again.
//
// A packet costs one map lookup per direction whatever the number of pods,
// and one set lookup per rule of the pods it concerns; the number of pods a
// rule selects only grows its set. The per-pod chains return instead of
// accepting, so a packet between two pods of this node passes the egress
// chain of its source and then the ingress chain of its destination.
//
// # Traffic of the node itself
//
// The table hooks forward only: the node's own packets to its pods (the
// kubelet's probes, a hostNetwork pod, kube-proxy's DNAT from the node)
// leave through output, and the pods' packets to the node's addresses
// arrive through input, so neither is filtered, as Kubernetes asks ("traffic
// to and from the node where a Pod is running is always allowed"). Nothing
// is recognised by address, so a pod cannot pose as the node. Packets of
// other nodes (their hostNetwork pods, their kubelets) are forwarded and
// follow the policies like any other source.
//
// # Why a connection is allowed or denied
//
// BuildModel runs the same compiler over every pod of the cluster and
// keeps, per pod and direction, the policies that isolate it and each
// rule's peer addresses and ports with where it comes from
// (spec.ingress[0].from[1]). The agent writes it beside the table
// (<run dir>/<network>/policy-model.json) after each compile it put in the
// kernel, and Explain, which is pure, reads it to say whether a connection
// is allowed and which policy and rule decide: `villaged why` answers on
// the node from what the node enforces, API server or not. Its tests
// check Explain against the compiled Ruleset packet by packet.
//
// # What was dropped
//
// Every per-pod chain counts what it drops in a counter object of its
// own, so the counts survive the rewrites (table.Update refills a chain
// and leaves its counter alone, table.Apply carries the counts over). It also sends a sample of its drops (20 a
// second at most) to NFLOG group table.LogGroup; the agent
// (pkg/netpol/drops) names each sample's pods and the policies isolating
// the dropping pod, keeps the latest in
// <run dir>/<network>/policy-drops.json for `villaged drops`, and exports
// the counts as village_policy_drops_total.
//
// # What is not covered
//
// The LAN interface (net1, a macvlan) hands frames to the master's driver
// below the host's IP stack: they never cross the node's netfilter, so
// policies do not filter it. Compile reports a policy that selects a pod
// with a LAN interface as a Problem, which the agent turns into an Event.
// hostNetwork pods share the node's addresses and are neither selected nor
// selectable (also a Problem when a policy selects one).
package netpol
