// Package owner derives what lets several Village networks on one node
// each find exactly their own kernel objects: the names of their nftables
// tables (table.go: Table, the one namer of every job's table) and the
// per-network tag in their routes' metrics: a route's metric is its protocol in the top byte and
// the network's tag below. The kernel stores a route's metric for IPv4 and
// IPv6 alike (unlike the realm, which IPv6 drops), a metric is part of the
// route's identity (two networks' routes to one destination are two routes,
// not one replacing the other), and between routes to different
// destinations it changes nothing.
package owner

import "hash/fnv"

// Tag is the low 24 bits of the FNV-1a hash of the network name.
func Tag(network string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(network))
	return h.Sum32() & 0xffffff
}

// Metric is the metric of network's routes of protocol proto:
// proto<<24 | Tag(network). It stays below 2^31 for every protocol below
// 128, so it fits the int the netlink library uses.
func Metric(proto uint8, network string) int {
	return int(uint32(proto)<<24 | Tag(network))
}
