// Package config parses and validates the IPAM configuration of village-ipam
// from the full network configuration a runtime (or the calling main plugin)
// writes to the plugin's stdin.
//
// The keys and their meaning follow the reference host-local IPAM plugin:
// "subnet"/"rangeStart"/"rangeEnd"/"gateway" (the single-range form),
// "ranges" (a list of range sets, one address is handed out per set, which is
// how dual stack is configured), "routes", "dataDir", "resolvConf", and the
// requested addresses from runtimeConfig.ips, args.cni.ips and CNI_ARGS IP=.
// Village adds a "store" block that selects where allocations are kept, and
// lets the range come from villaged: with no "subnet" and no "ranges", the
// range is read from the file `villaged run` publishes after leasing this
// node's pod subnet (subnetfile.Path, or ipam.subnetFile when set), so one
// conflist serves every node.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/subnetfile"
	"github.com/village-cni/village/pkg/validate"
)

// MaxConfigSize bounds the configuration Parse reads (the main plugin's
// bound too): a conflist entry is a few kilobytes.
const MaxConfigSize = 1 << 20

// ValidEndpoint reports whether e is an etcd endpoint Village accepts: an
// http:// or https:// URL with a host (the IPAM store's and the node
// registry's endpoints alike).
func ValidEndpoint(e string) bool {
	u, err := url.Parse(e)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// Store types accepted in ipam.store.type.
const (
	StoreDisk       = "disk"
	StoreEtcd       = "etcd"
	StoreKubernetes = "kubernetes"
)

// ErrNotLeased marks the error of a config with no range when villaged has
// not published one (yet): worth retrying later.
var ErrNotLeased = errors.New("no pod range in the config and villaged has not leased one yet (is `villaged run` running?)")

// Config is the validated IPAM configuration of one invocation.
type Config struct {
	// Name is the network name (the top-level "name"); it names the disk
	// store's directory, so it is validated as a single path component.
	Name string
	// CNIVersion is the top-level "cniVersion" ("0.1.0" when absent).
	CNIVersion string
	// Type is ipam.type.
	Type string
	// RangeSets are the range sets in order: the legacy single range first,
	// runtimeConfig.ipRanges before ipam.ranges (host-local's order). One
	// address is allocated from each set.
	RangeSets []RangeSet
	// Routes are copied into the ADD result.
	Routes []*types.Route
	// DataDir is the disk store's root (store.DefaultDataDir when empty).
	DataDir string
	// ResolvConf is a resolv.conf-style file whose contents become the
	// result's DNS section; empty means no DNS.
	ResolvConf string
	// RequestedIPs are the addresses the runtime asked for, from CNI_ARGS IP=,
	// args.cni.ips and runtimeConfig.ips, in that order, without duplicates.
	// Each must be granted or ADD fails.
	RequestedIPs []netip.Addr
	// Store selects the allocation store.
	Store StoreConfig
	// SubnetFile is ipam.subnetFile: where the range villaged leased is
	// read from ("" means subnetfile.Path("", Name)).
	SubnetFile string
	// ValidAttachments is the GC list (cni.dev/valid-attachments, or the
	// older cni.dev/attachments when the former is absent).
	ValidAttachments []Attachment
	// Sticky is ipam.sticky: how long a Kubernetes pod's address stays
	// held for the pod (its namespace/name) after DEL, so that the same pod
	// coming back on any node sharing the store gets it again. 0: off.
	Sticky time.Duration
	// PodNamespace and PodName are CNI_ARGS K8S_POD_NAMESPACE and
	// K8S_POD_NAME ("" when the runtime is not Kubernetes).
	PodNamespace, PodName string
}

// MaxSticky bounds ipam.sticky: a hold is for a pod being rescheduled, not
// a reservation (that is a fixed address).
const MaxSticky = 7 * 24 * time.Hour

// Attachment is one entry of the GC valid-attachments list.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// StoreConfig is ipam.store.
type StoreConfig struct {
	Type      string   `json:"type"`
	Endpoints []string `json:"endpoints"`
	Prefix    string   `json:"prefix"`
	CAFile    string   `json:"caFile"`
	CertFile  string   `json:"certFile"`
	KeyFile   string   `json:"keyFile"`
	NodeName  string   `json:"nodeName"`
	// Kubeconfig and Namespace are the kubernetes store's: a kubeconfig
	// file ("" = the one villaged publishes, nodelocal.HostKubeconfig) and
	// the namespace of its Leases. NodeName "" means the name villaged
	// published (nodelocal.NodeName).
	Kubeconfig string `json:"kubeconfig"`
	Namespace  string `json:"namespace"`
}

// RangeSet is a list of ranges of one address family; an allocation takes one
// address from any of them.
type RangeSet []Range

// Range is one allocatable range inside a subnet. After Parse every field is
// set: RangeStart defaults to the subnet's first address after the network
// address, RangeEnd to the last address (IPv4: the one before broadcast), and
// Gateway to the first address after the network address.
type Range struct {
	Subnet     netip.Prefix
	RangeStart netip.Addr
	RangeEnd   netip.Addr
	Gateway    netip.Addr
}

// String is "start-end", the way error messages name a range.
func (r Range) String() string { return r.RangeStart.String() + "-" + r.RangeEnd.String() }

// Contains reports whether a lies in [RangeStart, RangeEnd] (and therefore in
// the subnet).
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return a.BitLen() == r.RangeStart.BitLen() && r.Subnet.Contains(a) &&
		a.Compare(r.RangeStart) >= 0 && a.Compare(r.RangeEnd) <= 0
}

// Allocatable reports whether a is in the range and may be handed out: it is
// not the gateway, not the network address and (IPv4) not the broadcast
// address.
func (r Range) Allocatable(a netip.Addr) bool {
	a = a.Unmap()
	return r.Contains(a) && a != r.Gateway && !cidr.IsNetwork(r.Subnet, a) && !cidr.IsBroadcast(r.Subnet, a)
}

// Overlaps reports whether the address intervals of r and o intersect.
func (r Range) Overlaps(o Range) bool {
	if r.RangeStart.BitLen() != o.RangeStart.BitLen() {
		return false
	}
	return r.RangeStart.Compare(o.RangeEnd) <= 0 && o.RangeStart.Compare(r.RangeEnd) <= 0
}

// Family is 4 or 6.
func (s RangeSet) Family() int {
	if len(s) == 0 || s[0].Subnet.Addr().Is4() {
		return 4
	}
	return 6
}

// RangeFor returns the index of the range of s holding a, or -1.
func (s RangeSet) RangeFor(a netip.Addr) int {
	for i, r := range s {
		if r.Contains(a) {
			return i
		}
	}
	return -1
}

// String lists the set's ranges, comma separated.
func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// Error is a configuration error; Field names the offending key, e.g.
// "ipam.ranges[0][1].rangeStart".
type Error struct {
	Field string
	Err   error
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Err.Error()
	}
	return e.Field + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

func fieldErr(field, format string, a ...any) error {
	return &Error{Field: field, Err: fmt.Errorf(format, a...)}
}

// ErrDecode marks errors where stdin (or a value in it) is not the JSON the
// plugin expects.
var ErrDecode = errors.New("cannot decode network configuration")

type rawRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart"`
	RangeEnd   string `json:"rangeEnd"`
	Gateway    string `json:"gateway"`
}

// rangeKeys is the part of an IPAM block that says its type and ranges,
// in host-local's keys.
type rangeKeys struct {
	rawRange
	Type   string       `json:"type"`
	Ranges [][]rawRange `json:"ranges"`
}

type rawIPAM struct {
	rangeKeys
	Routes     []*types.Route `json:"routes"`
	DataDir    string         `json:"dataDir"`
	ResolvConf string         `json:"resolvConf"`
	Store      *StoreConfig   `json:"store"`
	// SubnetFile overrides where the range villaged leased is read from.
	SubnetFile string `json:"subnetFile"`
	Sticky     string `json:"sticky"`
}

type rawNet struct {
	Name          string   `json:"name"`
	CNIVersion    string   `json:"cniVersion"`
	IPAM          *rawIPAM `json:"ipam"`
	RuntimeConfig struct {
		IPRanges [][]rawRange `json:"ipRanges"`
		IPs      []string     `json:"ips"`
	} `json:"runtimeConfig"`
	Args *struct {
		CNI *struct {
			IPs []string `json:"ips"`
		} `json:"cni"`
	} `json:"args"`
	// Raw, so that a key present with null (what libcni sends for an empty
	// list) can be told from a missing key.
	ValidAttachments json.RawMessage `json:"cni.dev/valid-attachments"`
	Attachments      json.RawMessage `json:"cni.dev/attachments"`
}

// envArgs is the part of CNI_ARGS village-ipam reads.
type envArgs struct {
	types.CommonArgs
	IP                addrArg                    `json:"ip,omitempty"`
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // names fixed by kubelet
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive
}

// addrArg accepts an address or an address with prefix length ("10.1.0.5" or
// "10.1.0.5/24"); only the address is kept.
type addrArg struct{ netip.Addr }

func (a *addrArg) UnmarshalText(b []byte) error {
	addr, err := parseAddrOrCIDR(string(b))
	if err != nil {
		return err
	}
	a.Addr = addr
	return nil
}

func parseAddrOrCIDR(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%q is not an IP address: %w", s, err)
		}
		return p.Addr().Unmap(), nil
	}
	return parseAddr(s)
}

func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q has an IPv6 zone; zones are not allowed", s)
	}
	return a.Unmap(), nil
}

// Parse reads the full network configuration (stdin of the plugin) and the
// CNI_ARGS string, and returns the validated IPAM configuration. Errors are
// *Error naming the field, or wrap ErrDecode when stdin is not valid JSON.
func Parse(stdin []byte, cniArgs string) (*Config, error) {
	return parse(stdin, cniArgs, true)
}

// ParseStatic is Parse for a node's view of the configuration (villaged):
// the same validation, but a config with no range of its own keeps
// RangeSets empty instead of reading the range villaged leased.
func ParseStatic(stdin []byte) (*Config, error) {
	return parse(stdin, "", false)
}

func parse(stdin []byte, cniArgs string, leased bool) (*Config, error) {
	if len(stdin) > MaxConfigSize {
		return nil, fieldErr("config", "%d bytes, more than the %d a plugin config may have", len(stdin), MaxConfigSize)
	}
	var n rawNet
	if err := json.Unmarshal(stdin, &n); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	if err := validateName(n.Name); err != nil {
		return nil, err
	}
	if n.IPAM == nil {
		return nil, fieldErr("ipam", "missing; village-ipam needs an \"ipam\" object with \"ranges\" or \"subnet\"")
	}
	c := &Config{
		Name:       n.Name,
		CNIVersion: n.CNIVersion,
		Type:       n.IPAM.Type,
		Routes:     n.IPAM.Routes,
		DataDir:    n.IPAM.DataDir,
		ResolvConf: n.IPAM.ResolvConf,
		SubnetFile: n.IPAM.SubnetFile,
	}
	if c.CNIVersion == "" {
		c.CNIVersion = "0.1.0"
	}
	if c.DataDir == "" {
		c.DataDir = store.DefaultDataDir
	}
	// A relative directory would be resolved against whatever working
	// directory the runtime happens to exec the plugin in.
	if !filepath.IsAbs(c.DataDir) || strings.IndexByte(c.DataDir, 0) >= 0 {
		return nil, fieldErr("ipam.dataDir", "%q must be an absolute path", c.DataDir)
	}
	for i, r := range c.Routes {
		if r == nil {
			return nil, fieldErr(fmt.Sprintf("ipam.routes[%d]", i), "null route")
		}
	}
	if err := c.parseRequested(&n, cniArgs); err != nil {
		return nil, err
	}
	if err := c.parseSticky(n.IPAM.Sticky); err != nil {
		return nil, err
	}
	if err := c.parseRanges(&n, leased); err != nil {
		return nil, err
	}
	st, err := parseStore(n.IPAM.Store)
	if err != nil {
		return nil, err
	}
	c.Store = st
	if c.ValidAttachments, err = parseAttachments(n.ValidAttachments, n.Attachments); err != nil {
		return nil, err
	}
	return c, nil
}

// parseAttachments reads the GC list from cni.dev/valid-attachments, or the
// older cni.dev/attachments. A key that is present but null is an empty list
// (libcni marshals an empty Go slice that way); nil means neither key is set.
func parseAttachments(valid, old json.RawMessage) ([]Attachment, error) {
	raw, key := valid, "cni.dev/valid-attachments"
	if raw == nil {
		raw, key = old, "cni.dev/attachments"
	}
	if raw == nil {
		return nil, nil
	}
	list := []Attachment{}
	if string(raw) == "null" {
		return list, nil
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, &Error{Field: key, Err: err}
	}
	return list, nil
}

// validateName checks the network name with the shared rule (the CNI
// pattern, at most 200 bytes): it becomes a directory name and a key
// component, so it must be one safe path component.
func validateName(name string) error {
	if err := validate.NetworkName(name); err != nil {
		return &Error{Field: "name", Err: err}
	}
	return nil
}

func (c *Config) parseRequested(n *rawNet, cniArgs string) error {
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr) {
		if !seen[a] {
			seen[a] = true
			c.RequestedIPs = append(c.RequestedIPs, a)
		}
	}
	if cniArgs != "" {
		var e envArgs
		if err := types.LoadArgs(cniArgs, &e); err != nil {
			return fieldErr("CNI_ARGS", "%w", err)
		}
		if e.IP.IsValid() {
			add(e.IP.Addr)
		}
		// Kubernetes names (never '_', which a sticky hold's record uses
		// as its separator); either may be absent.
		c.PodNamespace, c.PodName = string(e.K8S_POD_NAMESPACE), string(e.K8S_POD_NAME)
		if c.PodNamespace != "" {
			if err := validate.NamespaceName(c.PodNamespace); err != nil {
				return fieldErr("CNI_ARGS", "K8S_POD_NAMESPACE: %w", err)
			}
		}
		if c.PodName != "" {
			if err := validate.PodName(c.PodName); err != nil {
				return fieldErr("CNI_ARGS", "K8S_POD_NAME: %w", err)
			}
		}
	}
	if n.Args != nil && n.Args.CNI != nil {
		for i, s := range n.Args.CNI.IPs {
			a, err := parseAddrOrCIDR(s)
			if err != nil {
				return fieldErr(fmt.Sprintf("args.cni.ips[%d]", i), "%w", err)
			}
			add(a)
		}
	}
	for i, s := range n.RuntimeConfig.IPs {
		a, err := parseAddrOrCIDR(s)
		if err != nil {
			return fieldErr(fmt.Sprintf("runtimeConfig.ips[%d]", i), "%w", err)
		}
		add(a)
	}
	return nil
}

func (c *Config) parseSticky(v string) error {
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second || d > MaxSticky {
		return fieldErr("ipam.sticky", "%q must be a duration from 1s to %s, such as \"5m\"", v, MaxSticky)
	}
	c.Sticky = d
	return nil
}

func (c *Config) parseRanges(n *rawNet, leased bool) error {
	var sets []src
	for i, s := range n.RuntimeConfig.IPRanges {
		sets = append(sets, src{fmt.Sprintf("runtimeConfig.ipRanges[%d]", i), s})
	}
	own, err := n.IPAM.sets()
	if err != nil {
		return err
	}
	sets = append(sets, own...)
	if len(sets) == 0 && leased {
		if sets, err = leasedSets(c.Name, n.IPAM.SubnetFile); err != nil {
			return err
		}
	}
	if c.RangeSets, err = parseRangeSets(sets); err != nil {
		return err
	}
	var v4, v6 int
	for _, rs := range c.RangeSets {
		if rs.Family() == 4 {
			v4++
		} else {
			v6++
		}
	}
	if v4 > 1 || v6 > 1 {
		if ok, err := version.GreaterThanOrEqualTo(c.CNIVersion, "0.3.0"); err == nil && !ok {
			return fieldErr("cniVersion", "%s allows only one address per family, but %d IPv4 and %d IPv6 range sets are configured; use cniVersion 0.3.0 or later", c.CNIVersion, v4, v6)
		}
	}
	return nil
}

// ParseRanges reads only the "type" and the ranges of an IPAM block (the
// single-range keys, then "ranges"), each range and set validated as Parse
// validates them: for a block that may belong to another plugin using
// host-local's range keys, whose ranges a node must still know (the pod
// LAN's, which the host shim routes). A block without ranges has none.
func ParseRanges(ipam []byte) (typ string, sets []RangeSet, err error) {
	var k rangeKeys
	if err := json.Unmarshal(ipam, &k); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	own, err := k.sets()
	if err != nil {
		return "", nil, err
	}
	if sets, err = parseRangeSets(own); err != nil {
		return "", nil, err
	}
	return k.Type, sets, nil
}

// ParseStore reads only the "store" of an IPAM block, validated and with
// its defaults filled as Parse does: for villaged, which opens a LAN pool's
// store to reclaim a departed node's allocations without the rest of the
// block. A block without a store is the disk store.
func ParseStore(ipam []byte) (StoreConfig, error) {
	var k struct {
		Store *StoreConfig `json:"store"`
	}
	if err := json.Unmarshal(ipam, &k); err != nil {
		return StoreConfig{}, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	return parseStore(k.Store)
}

// sets are the block's own range sets as written: the single range first.
func (k *rangeKeys) sets() ([]src, error) {
	var sets []src
	if k.Subnet != "" {
		sets = append(sets, src{"ipam", []rawRange{k.rawRange}})
	} else if k.RangeStart != "" || k.RangeEnd != "" || k.Gateway != "" {
		return nil, fieldErr("ipam.subnet", "missing, but rangeStart/rangeEnd/gateway are set; give the subnet they belong to")
	}
	for i, s := range k.Ranges {
		sets = append(sets, src{fmt.Sprintf("ipam.ranges[%d]", i), s})
	}
	return sets, nil
}

// parseRangeSets validates each set and that no two share an address.
func parseRangeSets(sets []src) ([]RangeSet, error) {
	var out []RangeSet
	for _, s := range sets {
		rs, err := parseRangeSet(s.field, s.raw)
		if err != nil {
			return nil, err
		}
		for j, prev := range out {
			if overlapsSet(prev, rs) {
				return nil, fieldErr(s.field, "range set %s overlaps range set %d (%s); range sets must not share addresses", rs, j, prev)
			}
		}
		out = append(out, rs)
	}
	return out, nil
}

// src is one range set as written, and the field that names it in errors.
type src struct {
	field string
	raw   []rawRange
}

// leasedSets reads the range villaged leased for this node: from subnetFile,
// or subnetfile.Path("", network).
func leasedSets(network, subnetFile string) ([]src, error) {
	path := subnetFile
	if path == "" {
		path = subnetfile.Path("", network)
	}
	prefixes, err := subnetfile.Read(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, &Error{Field: "ipam.ranges", Err: fmt.Errorf("%w: no address range configured (set ipam.ranges, e.g. [[{\"subnet\": \"10.22.0.0/16\"}]], or ipam.subnet) and %s does not exist", ErrNotLeased, path)}
	}
	if err != nil {
		return nil, fieldErr("ipam.subnetFile", "reading the range villaged leased: %w", err)
	}
	var out []src
	for _, p := range prefixes {
		out = append(out, src{path, []rawRange{{Subnet: p.String()}}})
	}
	return out, nil
}

func overlapsSet(a, b RangeSet) bool {
	for _, r := range a {
		for _, o := range b {
			if r.Overlaps(o) {
				return true
			}
		}
	}
	return false
}

func parseRangeSet(field string, raw []rawRange) (RangeSet, error) {
	if len(raw) == 0 {
		return nil, fieldErr(field, "empty range set; give at least one {\"subnet\": ...}")
	}
	var rs RangeSet
	for j, rr := range raw {
		f := field
		if field != "ipam" {
			f = fmt.Sprintf("%s[%d]", field, j)
		}
		r, err := parseRange(f, rr)
		if err != nil {
			return nil, err
		}
		if j > 0 && r.Subnet.Addr().BitLen() != rs[0].Subnet.Addr().BitLen() {
			return nil, fieldErr(f+".subnet", "%s mixes address families with %s in the same range set; put IPv4 and IPv6 in separate range sets", r.Subnet, rs[0].Subnet)
		}
		for k, prev := range rs {
			if prev.Overlaps(r) {
				return nil, fieldErr(f, "range %s overlaps range %d (%s) of the same set", r, k, prev)
			}
		}
		rs = append(rs, r)
	}
	return rs, nil
}

func parseRange(field string, rr rawRange) (Range, error) {
	var r Range
	if rr.Subnet == "" {
		return r, fieldErr(field+".subnet", "missing")
	}
	p, err := netip.ParsePrefix(rr.Subnet)
	if err != nil {
		return r, fieldErr(field+".subnet", "%q is not a CIDR (want e.g. 10.22.0.0/16 or fd00::/64): %w", rr.Subnet, err)
	}
	if p.Addr().Is4In6() {
		return r, fieldErr(field+".subnet", "%q is an IPv4-mapped IPv6 prefix; write the IPv4 subnet", rr.Subnet)
	}
	if p.Bits() > p.Addr().BitLen()-2 {
		return r, fieldErr(field+".subnet", "%s is too small to allocate from; use at most /30 for IPv4 and /126 for IPv6", p)
	}
	if p != p.Masked() {
		return r, fieldErr(field+".subnet", "%s has host bits set; the network address is %s", p, p.Masked())
	}
	r.Subnet = p
	parseIn := func(key, s string, def netip.Addr) (netip.Addr, error) {
		if s == "" {
			return def, nil
		}
		a, err := parseAddr(s)
		if err != nil {
			return a, fieldErr(field+"."+key, "%w", err)
		}
		if !p.Contains(a) {
			return a, fieldErr(field+"."+key, "%s is not in subnet %s", a, p)
		}
		return a, nil
	}
	first := p.Addr().Next()
	last := cidr.LastHost(p)
	if r.Gateway, err = parseIn("gateway", rr.Gateway, first); err != nil {
		return r, err
	}
	if r.RangeStart, err = parseIn("rangeStart", rr.RangeStart, first); err != nil {
		return r, err
	}
	if r.RangeEnd, err = parseIn("rangeEnd", rr.RangeEnd, last); err != nil {
		return r, err
	}
	if r.RangeStart.Compare(r.RangeEnd) > 0 {
		return r, fieldErr(field+".rangeStart", "%s is after rangeEnd %s", r.RangeStart, r.RangeEnd)
	}
	return r, nil
}

func parseStore(s *StoreConfig) (StoreConfig, error) {
	if s == nil {
		return StoreConfig{Type: StoreDisk}, nil
	}
	out := *s
	switch out.Type {
	case "", StoreDisk:
		out.Type = StoreDisk
		if len(out.Endpoints) > 0 {
			return out, fieldErr("ipam.store.endpoints", "only used with store type %q, but the type is %q", StoreEtcd, StoreDisk)
		}
		if out.Kubeconfig != "" || out.Namespace != "" {
			return out, fieldErr("ipam.store", "\"kubeconfig\" and \"namespace\" are only used with store type %q", StoreKubernetes)
		}
	case StoreEtcd:
		if len(out.Endpoints) == 0 {
			return out, fieldErr("ipam.store.endpoints", "missing; the etcd store needs at least one endpoint like \"https://10.0.0.1:2379\"")
		}
		for i, e := range out.Endpoints {
			if !ValidEndpoint(e) {
				return out, fieldErr(fmt.Sprintf("ipam.store.endpoints[%d]", i), "%q is not an http:// or https:// URL with a host", e)
			}
		}
		if (out.CertFile == "") != (out.KeyFile == "") {
			return out, fieldErr("ipam.store.certFile", "certFile and keyFile must be given together")
		}
		if out.Prefix == "" {
			out.Prefix = store.DefaultEtcdPrefix
		}
		if !strings.HasPrefix(out.Prefix, "/") {
			return out, fieldErr("ipam.store.prefix", "%q must start with '/'", out.Prefix)
		}
		if out.Kubeconfig != "" || out.Namespace != "" {
			return out, fieldErr("ipam.store", "\"kubeconfig\" and \"namespace\" are only used with store type %q", StoreKubernetes)
		}
	case StoreKubernetes:
		if len(out.Endpoints) > 0 || out.CAFile != "" || out.CertFile != "" || out.KeyFile != "" || out.Prefix != "" {
			return out, fieldErr("ipam.store", "type %q takes \"kubeconfig\" and \"namespace\", not etcd's endpoints, prefix or certificates", StoreKubernetes)
		}
		if out.Namespace != "" {
			if err := validate.NamespaceName(out.Namespace); err != nil {
				return out, &Error{Field: "ipam.store.namespace", Err: err}
			}
		}
	default:
		return out, fieldErr("ipam.store.type", "unknown store type %q; use %q, %q or %q", out.Type, StoreDisk, StoreEtcd, StoreKubernetes)
	}
	// Recorded with the allocations of the etcd and kubernetes stores and
	// matched against the registry's and the Node's names: a Node name.
	if out.NodeName != "" {
		if err := validate.NodeName(out.NodeName); err != nil {
			return out, &Error{Field: "ipam.store.nodeName", Err: err}
		}
	}
	return out, nil
}
