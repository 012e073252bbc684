// Package store defines the interface village-ipam keeps its allocations
// behind, so the allocator works the same over the node-local disk store
// (host-local's format) and a cluster-wide store such as etcd.
//
// Every mutation is atomic on its own: Claim is "reserve if free", Release
// removes an address only when the caller owns it. A store that needs mutual
// exclusion across processes for multi-step operations (the disk store, whose
// round-robin marker and index are plain files) does it in Lock; a store whose
// single operations are already transactional makes Lock a no-op.
package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/village-cni/village/pkg/validate"
)

// DefaultDataDir is where the disk store keeps its files when ipam.dataDir is
// empty; it is host-local's default, so both plugins share allocations.
const DefaultDataDir = "/var/lib/cni/networks"

// DefaultEtcdPrefix is the key prefix the etcd store uses when
// ipam.store.prefix is empty.
const DefaultEtcdPrefix = "/village"

// Owner identifies the attachment an address is allocated to. An empty IfName
// appears only in records written by very old host-local versions, which kept
// the container ID alone.
type Owner struct {
	ContainerID string
	IfName      string
}

func (o Owner) String() string {
	return fmt.Sprintf("container %q interface %q", o.ContainerID, o.IfName)
}

// Allocation is one reserved address.
type Allocation struct {
	IP    netip.Addr
	Owner Owner
}

// Claim asks for one address.
type Claim struct {
	IP    netip.Addr
	Owner Owner
	// RangeSet is the index of the range set IP comes from; on success the
	// store remembers IP as that set's last reserved address (round-robin).
	RangeSet int
}

// Store keeps the allocations of one network.
type Store interface {
	// Lock takes the store-wide lock and returns the function that releases
	// it. Callers hold it around every multi-step operation (an ADD, a DEL, a
	// GC). Stores without such a lock return a no-op unlock. A lock that
	// cannot be taken in time yields an error wrapping ErrBusy.
	Lock(ctx context.Context) (unlock func() error, err error)
	// Claim reserves c.IP for c.Owner if no one holds it. It reports false,
	// with no error, when the address is taken (by anyone, the caller too).
	Claim(ctx context.Context, c Claim) (bool, error)
	// Release frees ip if it is held by owner; it reports whether it did.
	// An address held by someone else is left alone.
	Release(ctx context.Context, ip netip.Addr, owner Owner) (bool, error)
	// ListByOwner returns the addresses held by owner.
	ListByOwner(ctx context.Context, owner Owner) ([]netip.Addr, error)
	// List returns every allocation of the network.
	List(ctx context.Context) ([]Allocation, error)
	// LastReserved returns the address last claimed from range set
	// rangeSet, or the zero Addr when none is recorded.
	LastReserved(ctx context.Context, rangeSet int) (netip.Addr, error)
	// GC releases every allocation whose owner keep does not keep and
	// returns what it released (stores that know which node made an
	// allocation ask only about their own node's). It keeps going after a
	// failure and returns the errors joined. Valid builds keep from the
	// runtime's list of valid attachments.
	GC(ctx context.Context, keep func(Owner) bool) ([]Allocation, error)
	// Close releases the store's resources (not its allocations).
	Close() error
}

// Valid returns the GC predicate of a runtime's list of valid attachments:
// an owner in the list, or a record written with only the container ID
// (very old host-local) whose container is in the list.
func Valid(valid []Owner) func(Owner) bool {
	keep := make(map[Owner]bool, len(valid))
	keepID := make(map[string]bool, len(valid))
	for _, o := range valid {
		keep[o] = true
		keepID[o.ContainerID] = true
	}
	return func(o Owner) bool { return keep[o] || (o.IfName == "" && keepID[o.ContainerID]) }
}

// ServiceOwnerPrefix starts the ContainerID of an address a LoadBalancer
// Service holds on the LAN (pkg/lansvc/alloc). Runtimes' container IDs
// are hex digits, so none collides with it. Every record keeps only the
// container ID and interface, so that records of any version read back
// with their kind: [Owner.Kind] reads it from this prefix, and nothing
// else should.
const ServiceOwnerPrefix = "village-lb_"

// OwnerKind is what holds an address: a pod's interface or a Service.
type OwnerKind int

const (
	// OwnerPod is a container's interface, made and removed by a runtime
	// on one node: its address lives as long as the attachment, and a
	// node that is gone for good takes it with it.
	OwnerPod OwnerKind = iota
	// OwnerService is a LAN Service (or a sharing key of Services): it
	// belongs to the cluster, not to the node that happened to write
	// it, so no GC of a runtime's attachments, no departed node's
	// reclaim and no Node's deletion frees it; villaged releases it when
	// the Service no longer asks for it.
	OwnerService
)

func (k OwnerKind) String() string {
	if k == OwnerService {
		return "service"
	}
	return "pod"
}

// Kind says whether o is a pod's or a Service's.
func (o Owner) Kind() OwnerKind {
	if strings.HasPrefix(o.ContainerID, ServiceOwnerPrefix) {
		return OwnerService
	}
	return OwnerPod
}

// ErrBusy is wrapped by errors of a store whose lock is held by someone else
// for longer than the store waits; the operation may be retried.
var ErrBusy = errors.New("store busy")

// ValidateOwner checks that a container ID and interface name are safe to
// record: the container ID as the CNI spec defines it
// (^[A-Za-z0-9][A-Za-z0-9_.-]*$), the interface name as Linux accepts it
// (1-15 bytes, not "." or "..", no '/', ':', whitespace or control bytes):
// pkg/validate's rules.
func ValidateOwner(o Owner) error {
	if err := validate.ContainerID(o.ContainerID); err != nil {
		return err
	}
	return validate.LinkName(o.IfName)
}
