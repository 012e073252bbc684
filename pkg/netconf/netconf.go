// Package netconf parses and validates the configuration of the `village`
// main plugin: the reference bridge plugin's keys with the same meaning, plus
// Village's own (clusterCIDR, macvlan, backend, logging). Everything that
// later becomes a link name, a path or an iptables argument is validated here,
// so the rest of the plugin can trust a *NetConf.
package netconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/validate"
)

// DefaultBridge is the bridge used when the config names none.
const DefaultBridge = "village0"

// MaxConfigSize bounds what the plugin will parse; a conflist entry is a few
// kilobytes, so anything near this is hostile or broken. It is village-ipam's
// bound (one value for every plugin).
const MaxConfigSize = ipamconfig.MaxConfigSize

// NetConf is one `village` entry of a conflist.
type NetConf struct {
	types.PluginConf

	Bridge       string `json:"bridge"`
	IsGateway    bool   `json:"isGateway"`
	IsDefaultGW  bool   `json:"isDefaultGateway"`
	ForceAddress bool   `json:"forceAddress"`
	IPMasq       bool   `json:"ipMasq"`
	MTU          int    `json:"mtu"`
	// HairpinMode defaults to true in Village (the reference defaults to
	// false): a pod reaching itself through a Service VIP needs it.
	HairpinMode *bool `json:"hairpinMode,omitempty"`
	PromiscMode bool  `json:"promiscMode"`
	Vlan        int   `json:"vlan"`
	// PreserveDefaultVlan keeps VLAN 1 on a pod port that "vlan" puts in
	// another VLAN (the reference removes it unless this is set).
	PreserveDefaultVlan bool `json:"preserveDefaultVlan"`

	// IPMasqBackend is "iptables", "nftables" or empty (Village picks:
	// iptables on iptables-legacy hosts, nftables elsewhere).
	IPMasqBackend string `json:"ipMasqBackend,omitempty"`
	// MacSpoofChk drops frames a pod sends with a source MAC other than
	// its interface's.
	MacSpoofChk bool `json:"macspoofchk,omitempty"`
	// PortIsolation sets the bridge port's isolated flag: pods of the
	// bridge cannot reach each other at L2.
	PortIsolation bool `json:"portIsolation,omitempty"`
	// ForwardAcceptRaw is Village's "forwardAccept" (default true): accept
	// rules for forwarded pod traffic on hosts whose FORWARD policy drops.
	ForwardAcceptRaw *bool `json:"forwardAccept,omitempty"`

	// Reference bridge keys Village does not implement: set, they are
	// rejected naming the key, never silently ignored.
	VlanTrunk                 json.RawMessage `json:"vlanTrunk,omitempty"`
	EnableDad                 bool            `json:"enabledad,omitempty"`
	DisableContainerInterface bool            `json:"disableContainerInterface,omitempty"`

	// ClusterCIDR is the whole pod network; masquerade skips traffic that
	// stays inside it. Empty: the pod subnet itself. Dual stack: one
	// network per family, separated by a comma (as kube-controller-manager's
	// --cluster-cidr), e.g. "10.244.0.0/16,fd00:10:244::/56"; a family
	// without one falls back to its pod subnet.
	ClusterCIDR string `json:"clusterCIDR,omitempty"`

	// NetworkPolicy (default false): villaged enforces Kubernetes
	// NetworkPolicy for the network's pods on the node; off, it removes
	// the policy tables an earlier run left.
	NetworkPolicy bool `json:"networkPolicy,omitempty"`

	// Sections owned by other parts of Village, kept raw here and parsed by
	// the package that implements them.
	Macvlan json.RawMessage `json:"macvlan,omitempty"`
	Backend json.RawMessage `json:"backend,omitempty"`

	LogFile  string `json:"logFile,omitempty"`
	LogLevel string `json:"logLevel,omitempty"`

	RuntimeConfig struct {
		Mac string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	Args *struct {
		CNI *struct {
			Mac string `json:"mac,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`

	// Derived by Parse.
	ForwardAccept bool             `json:"-"`
	Hairpin       bool             `json:"-"`
	ClusterNet    *net.IPNet       `json:"-"` // the first of ClusterNets (nil without clusterCIDR)
	MAC           net.HardwareAddr `json:"-"`
	IPAMType      string           `json:"-"`
	HasIPAM       bool             `json:"-"`
	// ClusterNets are clusterCIDR's networks, at most one per family, in
	// the order written.
	ClusterNets []*net.IPNet `json:"-"`
	// Overlay is the parsed backend section (type none when absent).
	Overlay *Backend `json:"-"`
	// LAN is the parsed macvlan section; nil when there is none.
	LAN *LAN `json:"-"`
	// LANArgs is the LAN request CNI_ARGS made (VILLAGE_LAN,
	// VILLAGE_LAN_IP); LANArgsSet says whether it made one.
	LANArgs    LANRequest `json:"-"`
	LANArgsSet bool       `json:"-"`
	// Pod names the Kubernetes pod of this call (CNI_ARGS K8S_POD_*);
	// empty outside Kubernetes.
	Pod PodRef `json:"-"`
}

// PodRef is the Kubernetes pod a CNI call is for, as kubelet names it in
// CNI_ARGS.
type PodRef struct {
	Namespace, Name, UID string
}

// EnvArgs are the CNI_ARGS keys Village understands. IP belongs to IPAM and
// the K8S_* keys are what kubelet and CRI runtimes send; listing them keeps
// an ADD from failing when IgnoreUnknown is not set.
type EnvArgs struct {
	types.CommonArgs
	MAC                        types.UnmarshallableString
	IP                         types.UnmarshallableString
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // names fixed by kubelet
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
	// A pod's LAN request outside Kubernetes (lanpods.go).
	VILLAGE_LAN    types.UnmarshallableString //nolint:revive // names fixed by the contract
	VILLAGE_LAN_IP types.UnmarshallableString //nolint:revive
}

// PodMTU decides the MTU of the bridge and the pod's interface: the
// configured "mtu" when set, else backendMTU (what the overlay reports the
// pods can use: the underlay's, less the VXLAN overhead with a VXLAN
// device), else 0 (the kernel's default, no overlay).
func (c *NetConf) PodMTU(backendMTU int) int {
	if c.MTU > 0 {
		return c.MTU
	}
	return max(backendMTU, 0)
}

// Error is a config error: it maps to CNI code 7 (invalid network config).
func Error(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, a...), "")
}

// Parse decodes and validates stdin; envArgs is CNI_ARGS. The returned error
// is always a *types.Error with the right code.
func Parse(stdin []byte, envArgs string) (*NetConf, error) {
	if len(stdin) > MaxConfigSize {
		return nil, Error("config is %d bytes, more than the %d a plugin config may have", len(stdin), MaxConfigSize)
	}
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("failed to parse network config: %v", err), "")
	}
	if conf.CNIVersion == "" {
		conf.CNIVersion = "0.1.0"
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("failed to parse prevResult: %v", err), "")
		}
	}
	if err := conf.validate(envArgs); err != nil {
		return nil, err
	}
	return conf, nil
}

func (c *NetConf) validate(envArgs string) *types.Error {
	if err := validate.NetworkName(c.Name); err != nil {
		return Error("invalid \"name\": %v", err)
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := validate.LinkName(c.Bridge); err != nil {
		return Error("invalid \"bridge\": %v", err)
	}
	if err := validate.MTU(c.MTU); err != nil {
		return Error("invalid \"mtu\": %v", err)
	}
	if c.Vlan < 0 || c.Vlan > 4094 {
		return Error("invalid \"vlan\" %d: must be 0 (none) or 1-4094", c.Vlan)
	}
	if err := c.validateNetfilter(); err != nil {
		return err
	}
	c.Hairpin = !c.PromiscMode
	if c.HairpinMode != nil {
		c.Hairpin = *c.HairpinMode
		if c.Hairpin && c.PromiscMode {
			return Error("cannot set both \"hairpinMode\" and \"promiscMode\": hairpin on the port and a promiscuous bridge do the same job, pick one")
		}
	}
	if c.ClusterCIDR != "" {
		nets, err := parseClusterCIDR(c.ClusterCIDR)
		if err != nil {
			return err
		}
		c.ClusterNets, c.ClusterNet = nets, nets[0]
	}
	if err := c.validateLog(); err != nil {
		return err
	}
	c.IPAMType = c.IPAM.Type
	c.HasIPAM = c.IPAMType != ""
	if c.HasIPAM {
		if err := ValidatePluginType(c.IPAMType); err != nil {
			return Error("invalid \"ipam.type\": %v", err)
		}
	}
	overlay, err := ParseBackend(c.Backend)
	if err != nil {
		return asCNIError(err)
	}
	c.Overlay = overlay
	lan, err := ParseLAN(c.Macvlan)
	if err != nil {
		return asCNIError(err)
	}
	c.LAN = lan
	if lan != nil {
		if err := ValidatePluginType(lan.IPAMType); err != nil {
			return Error("invalid \"macvlan.ipam.type\": %v", err)
		}
		if lan.Services != nil && overlay.Registry != nil {
			// A store block ipam/config refuses is the IPAM plugin's to
			// report, on the pod's ADD.
			if st, err := ipamconfig.ParseStore(lan.IPAM); err == nil {
				if err := checkServicesStore(overlay.Registry.Type, st.Type); err != nil {
					return err
				}
			}
		}
	}
	return c.parseMAC(envArgs)
}

// validateNetfilter checks the netfilter and security keys and rejects the
// reference bridge keys Village does not implement.
func (c *NetConf) validateNetfilter() *types.Error {
	switch c.IPMasqBackend {
	case "", "iptables", "nftables":
	default:
		return Error("invalid \"ipMasqBackend\" %q: one of \"iptables\", \"nftables\" (or leave it out: Village picks)", c.IPMasqBackend)
	}
	c.ForwardAccept = c.ForwardAcceptRaw == nil || *c.ForwardAcceptRaw
	if t := strings.TrimSpace(string(c.VlanTrunk)); t != "" && t != "null" && t != "[]" {
		return Error("\"vlanTrunk\" is not supported by village (VLAN trunk ports): remove it, or use the reference bridge plugin for this network")
	}
	if c.EnableDad {
		return Error("\"enabledad\" is not supported by village: pod IPv6 addresses come from IPAM and are configured without duplicate address detection; remove the key")
	}
	if c.DisableContainerInterface {
		return Error("\"disableContainerInterface\" is not supported by village: the pod interface is always brought up; remove the key")
	}
	return nil
}

func asCNIError(err error) *types.Error {
	if e, ok := err.(*types.Error); ok {
		return e
	}
	return Error("%v", err)
}

func (c *NetConf) validateLog() *types.Error {
	if c.LogFile != "" && !strings.HasPrefix(c.LogFile, "/") {
		return Error("invalid \"logFile\" %q: must be an absolute path", c.LogFile)
	}
	if _, err := validate.LogLevel(c.LogLevel); err != nil {
		return Error("invalid \"logLevel\": %v", err)
	}
	return nil
}

// parseMAC picks the container MAC the way the reference bridge does:
// runtimeConfig.mac, else args.cni.mac, else CNI_ARGS MAC=.
func (c *NetConf) parseMAC(envArgs string) *types.Error {
	mac, from := c.RuntimeConfig.Mac, "runtimeConfig.mac"
	if mac == "" && c.Args != nil && c.Args.CNI != nil {
		mac, from = c.Args.CNI.Mac, "args.cni.mac"
	}
	if envArgs != "" {
		e := EnvArgs{}
		if err := types.LoadArgs(envArgs, &e); err != nil {
			return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_ARGS: %v", err), "")
		}
		if mac == "" && e.MAC != "" {
			mac, from = string(e.MAC), "CNI_ARGS MAC"
		}
		var lerr *types.Error
		if c.LANArgs, c.LANArgsSet, lerr = lanArgs(&e); lerr != nil {
			return lerr
		}
		if err := c.parsePod(&e); err != nil {
			return err
		}
	}
	if mac == "" {
		return nil
	}
	hw, err := validate.MAC(mac)
	if err != nil {
		return Error("invalid %s: %v", from, err)
	}
	c.MAC = hw
	return nil
}

// parsePod keeps the pod's namespace and name from CNI_ARGS as they came:
// only a LAN lookup uses them, and it validates them first (PodRef.Check),
// so an ADD that needs no lookup is not refused over them.
func (c *NetConf) parsePod(e *EnvArgs) *types.Error {
	c.Pod = PodRef{Namespace: string(e.K8S_POD_NAMESPACE), Name: string(e.K8S_POD_NAME), UID: string(e.K8S_POD_UID)}
	return nil
}

// IsSet reports whether CNI_ARGS named a Kubernetes pod.
func (p PodRef) IsSet() bool { return p.Namespace != "" || p.Name != "" }

// Check validates the pod's names as Kubernetes names them: they are sent
// to the agent and logged.
func (p PodRef) Check() *types.Error {
	bad := func(key string, err error) *types.Error {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_ARGS %s: %v", key, err), "")
	}
	if err := validate.NamespaceName(p.Namespace); err != nil {
		return bad("K8S_POD_NAMESPACE", err)
	}
	if err := validate.PodName(p.Name); err != nil {
		return bad("K8S_POD_NAME", err)
	}
	if len(p.UID) > 128 {
		return bad("K8S_POD_UID", fmt.Errorf("longer than 128 bytes"))
	}
	return nil
}

// ValidatePluginType checks a plugin type that will be looked up in CNI_PATH:
// a bare file name, never a path.
func ValidatePluginType(t string) error {
	if t == "" || t == "." || t == ".." || strings.ContainsAny(t, "/\\\x00") || len(t) > 255 {
		return fmt.Errorf("%q is not a plugin name (a file name in CNI_PATH)", t)
	}
	return nil
}

// Netfilter is the netfilter state the network wants on a node whose pod
// subnets are subnets: masquerade when ipMasq, forward accept rules when
// forwardAccept, the pods' macspoofchk rules when macspoofchk
// (masq.Spec.Wants is false when it wants none). It is the one spec the
// plugin (from the pod's addresses) and villaged (from the node's pod
// subnets) build, so the stamp one records on the bridge is the stamp the
// other finds: the subnets are sorted and deduplicated, whatever order they
// come in (IPAM's result, a Node's spec.podCIDRs).
func (c *NetConf) Netfilter(subnets []*net.IPNet) masq.Spec {
	s := masq.Spec{Network: c.Name, PodSubnets: canonical(subnets), Backend: c.IPMasqBackend,
		ForwardAccept: c.ForwardAccept, NoMasquerade: !c.IPMasq, SpoofCheck: c.MacSpoofChk || c.NetworkPolicy}
	if len(c.ClusterNets) > 0 {
		s.Cluster = slices.Clone(c.ClusterNets)
	}
	return s
}

// parseClusterCIDR reads clusterCIDR: one network, or one per family
// separated by a comma, each without host bits.
func parseClusterCIDR(v string) ([]*net.IPNet, *types.Error) {
	parts := strings.Split(v, ",")
	if len(parts) > 2 {
		return nil, Error("invalid \"clusterCIDR\" %q: %d networks, want one, or one per family (IPv4,IPv6)", v, len(parts))
	}
	var nets []*net.IPNet
	for _, part := range parts {
		part = strings.TrimSpace(part)
		ip, n, err := net.ParseCIDR(part)
		if err != nil {
			return nil, Error("invalid \"clusterCIDR\" %q: %v", v, err)
		}
		if !ip.Equal(n.IP) {
			return nil, Error("invalid \"clusterCIDR\" %q: host bits set in %s, did you mean %s?", v, part, n)
		}
		if len(nets) == 1 && (nets[0].IP.To4() != nil) == (n.IP.To4() != nil) {
			return nil, Error("invalid \"clusterCIDR\" %q: %s and %s are of one family, want one network per family", v, nets[0], n)
		}
		nets = append(nets, n)
	}
	return nets, nil
}

// canonical returns the networks of subnets, IPv4 first, each family in
// address order, without repeats.
func canonical(subnets []*net.IPNet) []*net.IPNet {
	out := make([]*net.IPNet, 0, len(subnets))
	for _, sn := range subnets {
		n := &net.IPNet{IP: sn.IP.Mask(sn.Mask), Mask: sn.Mask}
		if !slices.ContainsFunc(out, func(o *net.IPNet) bool { return o.String() == n.String() }) {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *net.IPNet) int {
		a4, b4 := a.IP.To4() != nil, b.IP.To4() != nil
		if a4 != b4 {
			if a4 {
				return -1
			}
			return 1
		}
		if c := bytes.Compare(a.IP.To16(), b.IP.To16()); c != 0 {
			return c
		}
		ao, _ := a.Mask.Size()
		bo, _ := b.Mask.Size()
		return ao - bo
	})
	return out
}
