package agent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/etcdclient"
	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/registry"
	"github.com/village-cni/village/pkg/subnetfile"
	"github.com/village-cni/village/pkg/validate"
)

// DefaultPeriod is how often run's tick does its time-based work (held
// peers, reclaim, metrics, legacy iptables rules).
const DefaultPeriod = 10 * time.Second

// DefaultSafetyNet is how often, on average, run reads the whole kernel
// back when its notifications said nothing (Options.SafetyNet).
const DefaultSafetyNet = 5 * time.Minute

// Options are what the command line gives.
type Options struct {
	// ConfFile is a .conflist (the plugin whose type is "village" is used)
	// or a single plugin .conf.
	ConfFile string
	// NodeName names this node in the registry (and its Node object with
	// the kubernetes registry); "" means $NODE_NAME, else the host name
	// (nodelocal.DefaultNodeName). run publishes it for the stores
	// (nodelocal.NodeNameFile).
	NodeName string
	// RunDir is the run directory (nodelocal: the leased subnets, the node
	// name, the agent's socket); "" means $VILLAGE_RUN_DIR or /run/village
	// (what the plugins read).
	RunDir string
	// Period of the tick (DefaultPeriod when 0): the work that follows
	// the clock, not the kernel (held peers, reclaim, metrics, legacy
	// iptables rules, which send no notification), and a full pass while
	// the kernel watch may have missed notifications or after a failed
	// pass.
	Period time.Duration
	// SafetyNet is the mean time between full passes when nothing asked
	// for one (DefaultSafetyNet when 0, never shorter than Period), each
	// drawn between 0.8 and 1.2 of it so that a cluster's agents do not
	// read their kernels in step. It is also the policy controller's
	// repair period and the kubernetes registry's resync: what covers a
	// lost notification.
	SafetyNet time.Duration
	// MetricsAddr is where run serves /metrics and /healthz; "" turns
	// them off.
	MetricsAddr string
	// PublishConfDir, when set, is the CNI config directory run copies its
	// conflist (--conf, staged by `villaged install --stage-dir`) into once
	// the node holds its pod subnet, so the runtime sees the network only
	// when Village can address a pod. The copy stays when run exits.
	PublishConfDir string
	// DHCPDir is where run keeps the LAN pods' DHCP leases
	// (landhcp.DefaultDir when empty).
	DHCPDir string
	// Logf receives what run does; nil discards.
	Logf func(format string, args ...any)
}

// safetyNet is SafetyNet with its default and its floor (Period) applied.
func (o Options) safetyNet() time.Duration {
	s := o.SafetyNet
	if s <= 0 {
		s = DefaultSafetyNet
	}
	return max(s, o.Period)
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Conf is the part of a conflist the agent works from.
type Conf struct {
	File    string
	Net     *netconf.NetConf
	Backend *netconf.Backend
	// PodCIDRs are the pod subnets written in the IPAM block; empty means
	// the node leases one.
	PodCIDRs []*net.IPNet
	// SubnetFile is where a leased subnet is published.
	SubnetFile string
	// DataDir is the disk store's directory (host-local's layout), read to
	// report allocations per pool.
	DataDir string
	// wg is what this node publishes under the wireguard backend
	// (loadWireGuard).
	wg wgID
	// Node is this node's name.
	Node string
	// LANStore is the store block of the macvlan LAN pool's IPAM, parsed
	// once for the reclaimer and the host credentials (nil without a LAN
	// section, or when LANStoreErr says why it could not be read).
	LANStore    *ipamconfig.StoreConfig
	LANStoreErr error
}

// netfilter is the netfilter state the network wants on a node with pod
// subnets cidrs: the plugin's spec (netconf.NetConf.Netfilter).
func (c *Conf) netfilter(cidrs []*net.IPNet) masq.Spec { return c.Net.Netfilter(cidrs) }

// Registry is the backend's registry section, nil without one.
func (c *Conf) Registry() *netconf.Registry { return c.Backend.Registry }

// usesAPI says whether `villaged run` talks to the Kubernetes API (its
// Kubernetes side, kube.go): the kubernetes registry, a LAN section (LAN
// pods, Services, the pool's host credentials) or NetworkPolicy.
func (c *Conf) usesAPI() bool {
	r := c.Registry()
	return (r != nil && r.Type == netconf.RegistryKubernetes) || c.Net.LAN != nil || c.Net.NetworkPolicy
}

// Load reads opts.ConfFile and resolves the node name and file paths.
func Load(opts Options) (*Conf, error) {
	entry, err := readVillageEntry(opts.ConfFile)
	if err != nil {
		return nil, err
	}
	nc, err := netconf.Parse(entry, "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opts.ConfFile, err)
	}
	c := &Conf{File: opts.ConfFile, Net: nc, Backend: nc.Overlay}
	if c.Backend == nil {
		c.Backend = &netconf.Backend{Type: netconf.BackendNone}
	}
	// Without an IPAM plugin (which the plugin's ADD refuses) there is no
	// block to parse: the defaults, and no range of its own.
	ip := &ipamconfig.Config{DataDir: store.DefaultDataDir}
	if nc.HasIPAM {
		if ip, err = ipamconfig.ParseStatic(entry); err != nil {
			return nil, fmt.Errorf("%s: %w", opts.ConfFile, err)
		}
	}
	var subnets []netip.Prefix
	for _, set := range ip.RangeSets {
		for _, r := range set {
			subnets = append(subnets, r.Subnet)
		}
	}
	if len(subnets) > 0 {
		c.PodCIDRs = cidr.IPNets(subnets)
	}
	c.DataDir = ip.DataDir
	c.SubnetFile = ip.SubnetFile
	if c.SubnetFile == "" {
		c.SubnetFile = subnetfile.Path(opts.RunDir, nc.Name)
	}
	if nc.LAN != nil {
		st, err := ipamconfig.ParseStore(nc.LAN.IPAM)
		if err != nil {
			c.LANStoreErr = fmt.Errorf("%s: the LAN pool's store: %w", opts.ConfFile, err)
		} else {
			c.LANStore = &st
		}
	}
	c.Node = opts.NodeName
	if c.Node == "" {
		if c.Node, err = nodelocal.DefaultNodeName(); err != nil {
			return nil, fmt.Errorf("no --node-name: %w", err)
		}
	}
	if err := validate.NodeName(c.Node); err != nil {
		return nil, err
	}
	return c, nil
}

// readVillageEntry reads the configuration file at path and returns its
// first village entry (netconf.FromList).
func readVillageEntry(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the network configuration: %w", err)
	}
	entries, err := netconf.FromList(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return entries[0].Bytes, nil
}

// etcdConfig is how to reach the registry, with keep-alive on: the agent
// lives long, and must notice a connection that died with its source
// address (its lease would expire while every call hangs).
func (c *Conf) etcdConfig() etcdclient.Config {
	r := c.Registry()
	return etcdclient.Config{Endpoints: r.Endpoints, CAFile: r.CAFile, CertFile: r.CertFile, KeyFile: r.KeyFile, KeepAlive: keepAlive}
}

// keepAlive is the agent's etcd ping interval: just above etcd's default
// minimum (5 s; closer pings get the connection closed), so a dead
// connection is replaced within about 9 s.
const keepAlive = 6 * time.Second

// openRegistry connects to the registry of c (the caller closes the
// client with the returned func).
func (c *Conf) openRegistry() (*registry.Registry, func(), error) {
	r := c.Registry()
	if r == nil {
		return nil, nil, fmt.Errorf("%s: backend has no registry", c.File)
	}
	ec := c.etcdConfig()
	cli, err := etcdclient.New(ec)
	if err != nil {
		return nil, nil, err
	}
	reg, err := registry.New(cli, registry.Config{
		Etcd: ec, Prefix: r.Prefix, Network: c.Net.Name,
		TTL: time.Duration(r.TTL) * time.Second, Timeout: ec.Timeout(),
	})
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return reg, func() { cli.Close() }, nil
}

// subnetSpace is where this node's subnet is leased from.
func (c *Conf) subnetSpace() (registry.SubnetSpace, error) {
	if len(c.Net.ClusterNets) > 1 {
		return registry.SubnetSpace{}, fmt.Errorf("%s: the IPAM block names no range, so villaged leases one, from one clusterCIDR network, but %q names one per family; give ipam ranges for dual stack with the etcd registry", c.File, c.Net.ClusterCIDR)
	}
	sp, err := registry.NewSubnetSpace(c.Net.ClusterNet, c.Registry().SubnetLen)
	if err != nil {
		return sp, fmt.Errorf("%s: the IPAM block names no range, so villaged leases one: %w", c.File, err)
	}
	return sp, nil
}
