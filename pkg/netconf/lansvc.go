package netconf

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/ipam/config"
)

// Services is "macvlan.services": LoadBalancer Services get addresses on
// the LAN (issue 39's contract). Its presence turns the feature on.
type Services struct {
	// Ranges are the Service addresses, in village-ipam's range syntax
	// ([[{"subnet": ..., "rangeStart": ..., "rangeEnd": ...}]], one set
	// per family), each inside a subnet of the LAN IPAM block. They are
	// allocated in the LAN pool's own store, so a pod and a Service never
	// hold the same address.
	Ranges json.RawMessage `json:"ranges"`
	// RequireClass limits the feature to Services whose
	// spec.loadBalancerClass is village.cni.io/lan; by default Services
	// with no class are taken too.
	RequireClass bool `json:"requireClass,omitempty"`
	// GossipKeyFile is a file holding the agents' gossip key (the base64
	// of 16, 24 or 32 random bytes; the shipped DaemonSet mounts the
	// Secret village-gossip there). With it the gossip is encrypted and
	// authenticated, and a host of the LAN without the key cannot join
	// the election; without it any host on the LAN can, and the agent
	// warns. A set but unreadable key leaves the feature off: asked to
	// authenticate, the agent does not fall back to gossip in the clear.
	GossipKeyFile string `json:"gossipKeyFile,omitempty"`

	// Sets are Ranges as ipam/config parsed them (derived by Parse).
	Sets []config.RangeSet `json:"-"`
}

// parseServices validates "services" against the LAN pool it shares a
// store with.
func (c *LAN) parseServices() error {
	if len(c.ServicesRaw) == 0 || string(c.ServicesRaw) == "null" {
		return nil
	}
	s := &Services{}
	if err := json.Unmarshal(c.ServicesRaw, s); err != nil {
		return invalidLAN("\"services\": %v", err)
	}
	if c.IPAMType == LANDHCP {
		return invalidLAN("\"services\" needs a LAN pool with a store (village-ipam); with \"ipam.type\" dhcp the LAN's DHCP server owns the addresses")
	}
	if len(s.Ranges) == 0 || string(s.Ranges) == "null" {
		return invalidLAN("\"services.ranges\" is required: the LAN addresses Services get, e.g. [[{\"subnet\": \"192.168.50.0/24\", \"rangeStart\": \"192.168.50.240\", \"rangeEnd\": \"192.168.50.250\"}]]")
	}
	// The same range syntax and checks as village-ipam's "ranges".
	block, err := json.Marshal(map[string]json.RawMessage{"ranges": s.Ranges})
	if err != nil {
		return invalidLAN("\"services.ranges\": %v", err)
	}
	_, sets, err := config.ParseRanges(block)
	if err != nil {
		return invalidLAN("\"services\": %v", err)
	}
	if len(sets) == 0 {
		return invalidLAN("\"services.ranges\" is empty")
	}
	if s.GossipKeyFile != "" && !filepath.IsAbs(s.GossipKeyFile) {
		return invalidLAN("\"services.gossipKeyFile\" %q: want an absolute path", s.GossipKeyFile)
	}
	var lanSubnets []string
	for _, set := range c.Sets {
		for _, r := range set {
			lanSubnets = append(lanSubnets, r.Subnet.String())
		}
	}
	for _, set := range sets {
		for _, r := range set {
			if !c.inLANSubnet(r) {
				return invalidLAN("\"services.ranges\": %s is not inside the LAN subnet (%v)", r, lanSubnets)
			}
			if gw, ok := c.gatewayIn(r); ok {
				return invalidLAN("\"services.ranges\": %s holds the LAN gateway %s: a Service given it would take the router's address (every LAN host's traffic); start the range after it", r, gw)
			}
		}
	}
	s.Sets = sets
	c.Services = s
	return nil
}

// inLANSubnet says whether r lies inside one subnet of the LAN IPAM block.
func (c *LAN) inLANSubnet(r config.Range) bool {
	for _, set := range c.Sets {
		for _, l := range set {
			if l.Subnet.Bits() <= r.Subnet.Bits() && l.Subnet.Contains(r.Subnet.Addr()) {
				return true
			}
		}
	}
	return false
}

// gatewayIn returns the LAN gateway (a LAN range's "gateway", by default
// its subnet's first address) that Service range r could hand out, if any.
func (c *LAN) gatewayIn(r config.Range) (netip.Addr, bool) {
	for _, set := range c.Sets {
		for _, l := range set {
			if l.Gateway.IsValid() && r.Allocatable(l.Gateway) {
				return l.Gateway, true
			}
		}
	}
	return netip.Addr{}, false
}

// checkServicesStore refuses "services" whose LAN pool lives in the disk
// store while the nodes share a registry: every node would allocate
// Service addresses from its own disk, alone, and two nodes would hand out
// the same address. registry is the backend's registry type ("" without
// one), store the LAN pool's store type (ipam/config's Store*).
func checkServicesStore(registry, store string) *types.Error {
	if registry != RegistryKubernetes || store != config.StoreDisk {
		return nil
	}
	return invalidLAN("\"services\" with the LAN pool's store of type %q under the %q registry: each node would allocate Service addresses alone from its own disk, and two nodes would give out the same address; use \"store\": {\"type\": %q} (or %q)",
		store, registry, config.StoreKubernetes, config.StoreEtcd)
}

// String names the Service ranges in messages.
func (s *Services) String() string {
	if s == nil {
		return "off"
	}
	var out []string
	for _, set := range s.Sets {
		out = append(out, set.String())
	}
	return fmt.Sprint(out)
}
