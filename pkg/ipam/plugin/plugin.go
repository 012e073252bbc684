// Package plugin implements the CNI verbs of village-ipam (ADD, DEL, CHECK,
// STATUS, GC) as functions for skel.PluginMainFuncs. Each verb parses the
// configuration, opens the configured store and runs the allocator; every
// error it returns is a *types.Error with a code a runtime can act on.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/cidr"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/ipam/allocator"
	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/nodelocal"
)

// Plugin-specific error codes (CNI reserves 100 and up for plugins).
const (
	// ErrCodeExhausted: a range set has no free address.
	ErrCodeExhausted uint = 100
	// ErrCodeAddressUnavailable: a requested address cannot be granted
	// (taken, outside every range, the gateway, ...).
	ErrCodeAddressUnavailable uint = 101
	// ErrCodeNoAllocation: CHECK found no address for the attachment.
	ErrCodeNoAllocation uint = 102
)

// DetailOutsidePool is the details of an ErrCodeAddressUnavailable error
// when the requested address is in no range of the network (rather than
// taken): the village plugin reports it to the agent as its own reason
// without reading the message.
const DetailOutsidePool = "outside-pool"

// LockTimeoutEnv overrides how long the disk store waits for its lock (a Go
// duration such as "500ms"; default 30s). Meant for tests; runtimes do not
// set it.
const LockTimeoutEnv = "VILLAGE_IPAM_LOCK_TIMEOUT"

// OpenFunc opens the store a configuration selects.
type OpenFunc func(ctx context.Context, c *config.Config) (store.Store, error)

// backends maps ipam.store.type to its opener. The etcd store registers
// itself here when it is built in.
var backends = map[string]OpenFunc{config.StoreDisk: openDisk}

// Prober is implemented by stores that can check they are usable (writable
// directory, reachable cluster) without changing any allocation; STATUS
// uses it.
type Prober interface {
	Probe(ctx context.Context) error
}

func openDisk(ctx context.Context, c *config.Config) (store.Store, error) {
	opts := disk.Options{DataDir: c.DataDir, Network: c.Name}
	if v := os.Getenv(LockTimeoutEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("%s=%q is not a positive duration such as 500ms", LockTimeoutEnv, v), "")
		}
		opts.LockTimeout = d
	}
	return disk.New(opts)
}

type invocation struct {
	cfg   *config.Config
	owner store.Owner
	pod   allocator.Pod // the Kubernetes pod, for sticky addresses
	store store.Store
	alloc *allocator.Allocator
}

// setup parses the configuration and opens the store. withOwner validates
// CNI_CONTAINERID and CNI_IFNAME (ADD, DEL, CHECK).
func setup(ctx context.Context, args *skel.CmdArgs, withOwner bool) (*invocation, error) {
	cfg, err := config.Parse(args.StdinData, args.Args)
	if err != nil {
		return nil, configError(err)
	}
	inv := &invocation{cfg: cfg}
	if withOwner {
		inv.owner = store.Owner{ContainerID: args.ContainerID, IfName: args.IfName}
		if err := store.ValidateOwner(inv.owner); err != nil {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_CONTAINERID/CNI_IFNAME: %v", err), "")
		}
	}
	open, ok := backends[cfg.Store.Type]
	if !ok {
		return nil, types.NewError(types.ErrUnsupportedField,
			fmt.Sprintf("ipam.store.type %q is not built into this binary: use village-ipam, which runs the right helper for each store type", cfg.Store.Type), "")
	}
	st, err := open(ctx, cfg)
	if err != nil {
		return nil, storeError(fmt.Errorf("opening the %s store of network %q: %w", cfg.Store.Type, cfg.Name, err))
	}
	inv.store = st
	inv.alloc = &allocator.Allocator{Store: st, Network: cfg.Name, RangeSets: cfg.RangeSets, Sticky: cfg.Sticky}
	inv.pod = allocator.Pod{Namespace: cfg.PodNamespace, Name: cfg.PodName}
	return inv, nil
}

func configError(err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if errors.Is(err, config.ErrNotLeased) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	// A bad CNI_ARGS is a bad environment (code 4), as in village itself.
	var fe *config.Error
	if errors.As(err, &fe) && fe.Field == "CNI_ARGS" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid IPAM configuration: "+err.Error(), "")
}

// storeError maps allocator and store errors to CNI errors.
func storeError(err error) error {
	var te *types.Error
	var ex *allocator.ExhaustedError
	var ae *allocator.AddressError
	switch {
	case errors.As(err, &te):
		return te
	case errors.As(err, &ex):
		return types.NewError(ErrCodeExhausted, err.Error(), "")
	case errors.As(err, &ae) && ae.Outside:
		return types.NewError(ErrCodeAddressUnavailable, err.Error(), DetailOutsidePool)
	case errors.As(err, &ae):
		return types.NewError(ErrCodeAddressUnavailable, err.Error(), "")
	case errors.Is(err, store.ErrBusy), errors.Is(err, context.DeadlineExceeded), errors.Is(err, nodelocal.ErrNodeNameNotPublished):
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	default:
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
}

// Add allocates one address per range set (or returns the ones the
// attachment already holds) and prints the result in the configured
// cniVersion.
func Add(args *skel.CmdArgs) error {
	ctx := context.Background()
	t := time.Now()
	if err := waitForLease(args.StdinData, args.Args); err != nil {
		return err
	}
	inv, err := setup(ctx, args, true)
	if err != nil {
		return err
	}
	defer inv.store.Close()
	cnilog.Step("setup", t)

	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: inv.cfg.Routes}
	if inv.cfg.ResolvConf != "" {
		dns, err := parseResolvConf(inv.cfg.ResolvConf)
		if err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("ipam.resolvConf: %v", err), "")
		}
		result.DNS = *dns
	}
	t = time.Now()
	assigned, err := inv.alloc.Allocate(ctx, allocator.Request{Owner: inv.owner, Pod: inv.pod, RequestedIPs: inv.cfg.RequestedIPs})
	cnilog.Step("allocate", t)
	if err != nil {
		return storeError(err)
	}
	for _, a := range assigned {
		result.IPs = append(result.IPs, &current.IPConfig{Address: *cidr.IPNet(a.Prefix()), Gateway: net.IP(a.Range.Gateway.AsSlice())})
	}
	if err := types.PrintResult(result, inv.cfg.CNIVersion); err != nil {
		// Nothing of this ADD reached the runtime: freed, not held.
		if _, rerr := inv.alloc.Release(ctx, inv.owner, allocator.Pod{}); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("printing the result: %v", err), "")
	}
	return nil
}

// Del releases every address the attachment holds in this network (with
// ipam.sticky and a Kubernetes pod, holds them for the pod); nothing held
// is success.
func Del(args *skel.CmdArgs) error {
	ctx := context.Background()
	inv, err := setup(ctx, args, true)
	if err != nil {
		return err
	}
	defer inv.store.Close()
	if _, err := inv.alloc.Release(ctx, inv.owner, inv.pod); err != nil {
		return storeError(fmt.Errorf("releasing the addresses of %v in network %q: %w", inv.owner, inv.cfg.Name, err))
	}
	return nil
}

// Check fails when the attachment holds no address in some range set, or
// does not hold an address of prevResult that lies in a configured range.
func Check(args *skel.CmdArgs) error {
	ctx := context.Background()
	inv, err := setup(ctx, args, true)
	if err != nil {
		return err
	}
	defer inv.store.Close()
	held, err := inv.alloc.Held(ctx, inv.owner)
	if err != nil {
		return storeError(err)
	}
	have := make([]bool, len(inv.cfg.RangeSets))
	holds := map[netip.Addr]bool{}
	for _, a := range held {
		have[a.RangeSet] = true
		holds[a.IP] = true
	}
	for i, ok := range have {
		if !ok {
			return types.NewError(ErrCodeNoAllocation, fmt.Sprintf("%v holds no address in range set %s of network %q; the allocation was released or lost: delete and re-create the pod (CNI DEL then ADD)",
				inv.owner, inv.cfg.RangeSets[i], inv.cfg.Name), "")
		}
	}
	prev, err := prevResultIPs(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: %v", err), "")
	}
	for _, ip := range prev {
		inRange := false
		for _, s := range inv.cfg.RangeSets {
			inRange = inRange || s.RangeFor(ip) >= 0
		}
		if inRange && !holds[ip] {
			return types.NewError(ErrCodeNoAllocation, fmt.Sprintf("prevResult has %s, but %v does not hold it in network %q (it holds %v); delete and re-create the pod", ip, inv.owner, inv.cfg.Name, heldIPs(held)), "")
		}
	}
	return nil
}

func heldIPs(as []allocator.Assignment) []netip.Addr {
	out := make([]netip.Addr, len(as))
	for i, a := range as {
		out[i] = a.IP
	}
	return out
}

func prevResultIPs(stdin []byte) ([]netip.Addr, error) {
	var nc types.NetConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return nil, err
	}
	if nc.RawPrevResult == nil {
		return nil, nil
	}
	if err := version.ParsePrevResult(&nc); err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(nc.PrevResult)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ipc := range res.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			out = append(out, a.Unmap())
		}
	}
	return out, nil
}

// Status reports the plugin unavailable (code 50) when the store cannot be
// used, villaged has not published the node's subnet yet, or some range
// set has no free address left.
func Status(args *skel.CmdArgs) error {
	ctx := context.Background()
	if err := notLeased(args.StdinData, args.Args); err != nil {
		return err
	}
	inv, err := setup(ctx, args, false)
	if err != nil {
		var te *types.Error
		if errors.As(err, &te) && te.Code == types.ErrIOFailure {
			te.Code = types.ErrPluginNotAvailable
		}
		return err
	}
	defer inv.store.Close()
	if p, ok := inv.store.(Prober); ok {
		if err := p.Probe(ctx); err != nil {
			if errors.Is(err, store.ErrBusy) {
				return storeError(err)
			}
			return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("the store of network %q is not usable: %v", inv.cfg.Name, err), "")
		}
	}
	usage, err := inv.alloc.Usage(ctx)
	if err != nil {
		if errors.Is(err, store.ErrBusy) {
			return storeError(err)
		}
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	for _, u := range usage {
		if u.Full() {
			return types.NewError(types.ErrPluginNotAvailable, (&allocator.ExhaustedError{Network: inv.cfg.Name, Ranges: u.Ranges}).Error(), "")
		}
	}
	return nil
}

// GC releases every allocation of the network whose attachment is not in
// cni.dev/valid-attachments (or the older cni.dev/attachments), and every
// sticky hold that has ended. It keeps going after a failure and reports
// all of them.
func GC(args *skel.CmdArgs) error {
	ctx := context.Background()
	inv, err := setup(ctx, args, false)
	if err != nil {
		return err
	}
	defer inv.store.Close()
	if inv.cfg.ValidAttachments == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "GC needs cni.dev/valid-attachments (an empty list releases everything); refusing to guess", "")
	}
	valid := make([]store.Owner, 0, len(inv.cfg.ValidAttachments))
	for _, a := range inv.cfg.ValidAttachments {
		valid = append(valid, store.Owner{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	released, err := inv.alloc.GC(ctx, valid)
	for _, r := range released {
		fmt.Fprintf(os.Stderr, "village-ipam: GC released %s of %v in network %q\n", r.IP, r.Owner, inv.cfg.Name)
	}
	if err != nil {
		return storeError(fmt.Errorf("GC of network %q (released %d stale addresses): %w", inv.cfg.Name, len(released), err))
	}
	return nil
}
