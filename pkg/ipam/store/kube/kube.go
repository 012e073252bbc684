// Package kube is village-ipam's cluster-wide store kept in the Kubernetes
// API, for clusters that run no etcd of their own: several nodes share one
// address pool (a LAN range for macvlan pods) and an address is never handed
// out twice.
//
// # One Lease per address
//
// Each allocation is one coordination.k8s.io/v1 Lease in one namespace
// (kube-system by default), named after the network and the address:
//
//	village-ipam-<network hash>-<ip>          (IPv6 fully expanded, ':' as '-')
//	  labels      village.cni.io/ipam-network=<network hash>
//	              village.cni.io/ipam-owner=<hash of containerID/ifName>
//	              village.cni.io/ipam-node=<hash of the node name>
//	  annotations village.cni.io/ipam-ip, -network, -container-id, -ifname, -node
//	  ownerReferences  the Node that allocated it (when it exists), for a pod's address only
//	village-ipam-<network hash>-last-<rangeSet>   spec.holderIdentity = the last address reserved
//
// A Lease rather than a CustomResourceDefinition: the kind is built into
// every cluster (nothing to install, upgrade or wait for before the first
// pod), it is small, RBAC can grant it in one namespace only, and nothing in
// Kubernetes acts on Leases it did not create. What the store needs from it
// is only what the API gives every object: Create fails with AlreadyExists
// when the name is taken (Claim is create-if-absent, so of any number of
// claimers on any nodes exactly one wins), and Delete with a UID and
// resourceVersion precondition removes exactly the object whose owner was
// checked (Release and GC are compare-and-set). Lock is a no-op.
//
// # Deleted Nodes
//
// A pod's allocation carries an ownerReference to the Node that made it, so
// when a Node is deleted the cluster's garbage collector
// (kube-controller-manager) deletes its allocations. GC on any node also
// releases the pod allocations whose Node is gone (its UID no longer
// exists), so the pool recovers even without the garbage collector. A LAN
// Service's allocation (store.OwnerService) has no ownerReference and is
// never released for a Node: a home-lab node unplugged for a weekend and
// deleted must not move a Service to another address. GC otherwise
// releases only this node's allocations: the runtime's list of valid
// attachments knows nothing of other nodes' pods.
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/kubeconfig"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/validate"
)

// DefaultNamespace holds the Leases when ipam.store.namespace is empty.
const DefaultNamespace = "kube-system"

// LeasePrefix begins the name of every Lease the store writes; the shipped
// ValidatingAdmissionPolicy village-ipam (deploy/kubernetes/admission.yaml)
// refuses the store's identity a write to any other Lease.
const LeasePrefix = "village-ipam-"

// DefaultOpTimeout bounds each API request.
const DefaultOpTimeout = 10 * time.Second

// Label and annotation keys (pkg/kubenames).
const (
	labelNetwork = kubenames.LabelIPAMNetwork
	labelOwner   = kubenames.LabelIPAMOwner
	labelNode    = kubenames.LabelIPAMNode
	labelKind    = kubenames.LabelIPAMKind
	annIP        = kubenames.AnnotationIPAMIP
	annNetwork   = kubenames.AnnotationIPAMNetwork
	annContainer = kubenames.AnnotationIPAMContainer
	annIfName    = kubenames.AnnotationIPAMIfName
	annNode      = kubenames.AnnotationIPAMNode
)

// Options configure a Store.
type Options struct {
	// Kubeconfig is a kubeconfig file; "" means the one villaged publishes
	// for the host (nodelocal.PublishedKubeconfig): the store runs in a
	// plugin on the host, where in-cluster credentials never exist.
	Kubeconfig string
	// Namespace holds the Leases (DefaultNamespace when empty).
	Namespace string
	// Network is the CNI network name.
	Network string
	// NodeName is recorded with each allocation and scopes GC; empty means
	// the name villaged published for Network (nodelocal.NodeName).
	NodeName string
	// OpTimeout bounds each request (DefaultOpTimeout when 0).
	OpTimeout time.Duration
	// Client, when set, is used instead of one made from Kubeconfig.
	Client kubernetes.Interface
}

// Store is the Kubernetes store of one network; safe for concurrent use.
type Store struct {
	cs      kubernetes.Interface
	ns      string
	net     string
	netHash string
	node    string
	timeout time.Duration
	where   string
}

var _ store.Store = (*Store)(nil)

// New validates opts and makes the client; no request is made yet.
func New(opts Options) (*Store, error) {
	if opts.Network == "" {
		return nil, errors.New("kubernetes store: empty network name")
	}
	s := &Store{cs: opts.Client, ns: opts.Namespace, net: opts.Network, node: opts.NodeName, timeout: opts.OpTimeout}
	if s.ns == "" {
		s.ns = DefaultNamespace
	}
	if s.timeout <= 0 {
		s.timeout = DefaultOpTimeout
	}
	if s.node == "" {
		var err error
		if s.node, err = nodelocal.NodeName(s.net); err != nil {
			return nil, fmt.Errorf("kubernetes store: no node name given: %w; set ipam.store.nodeName", err)
		}
	}
	if err := validate.NodeName(s.node); err != nil {
		return nil, fmt.Errorf("kubernetes store: %w; set ipam.store.nodeName", err)
	}
	s.netHash = hash(s.net)
	host := "(client)"
	if s.cs == nil {
		path := opts.Kubeconfig
		if path == "" {
			var err error
			if path, err = nodelocal.PublishedKubeconfig(); err != nil {
				return nil, fmt.Errorf("kubernetes store: %w", err)
			}
		}
		rc, err := kubeconfig.REST(path)
		if err != nil {
			return nil, err
		}
		rc.UserAgent = "village-ipam-kube"
		if s.cs, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("kubernetes store at %s: %w", rc.Host, err)
		}
		host = rc.Host
	}
	s.where = fmt.Sprintf("kubernetes API %s, namespace %s", host, s.ns)
	return s, nil
}

func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:16]
}

func ownerHash(o store.Owner) string { return hash(o.ContainerID + "/" + o.IfName) }

// name is the Lease name of ip's allocation.
func (s *Store) name(ip netip.Addr) string {
	a := ip.Unmap().String()
	if ip.Unmap().Is6() {
		a = strings.ReplaceAll(ip.StringExpanded(), ":", "-")
	}
	return LeasePrefix + s.netHash + "-" + a
}

func (s *Store) lastName(rangeSet int) string {
	return LeasePrefix + s.netHash + "-last-" + strconv.Itoa(rangeSet)
}

func (s *Store) leases() leaseClient { return s.cs.CoordinationV1().Leases(s.ns) }

type leaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordv1.Lease, error)
	List(ctx context.Context, opts metav1.ListOptions) (*coordv1.LeaseList, error)
	Create(ctx context.Context, l *coordv1.Lease, opts metav1.CreateOptions) (*coordv1.Lease, error)
	Update(ctx context.Context, l *coordv1.Lease, opts metav1.UpdateOptions) (*coordv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// op bounds f by the timeout and names the API server and what in errors.
func (s *Store) op(ctx context.Context, what string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := f(ctx); err != nil {
		return fmt.Errorf("%s: %s: %w", s.where, what, err)
	}
	return nil
}

// Lock is a no-op: every mutation is one atomic request.
func (s *Store) Lock(context.Context) (func() error, error) { return func() error { return nil }, nil }

// Claim creates ip's Lease; AlreadyExists means someone holds it.
func (s *Store) Claim(ctx context.Context, c store.Claim) (bool, error) {
	if err := store.ValidateOwner(c.Owner); err != nil {
		return false, err
	}
	l := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.name(c.IP),
			Labels: map[string]string{labelNetwork: s.netHash, labelOwner: ownerHash(c.Owner),
				labelNode: hash(s.node), labelKind: "address"},
			Annotations: map[string]string{annIP: c.IP.String(), annNetwork: s.net, annContainer: c.Owner.ContainerID,
				annIfName: c.Owner.IfName, annNode: s.node},
		},
		Spec: coordv1.LeaseSpec{HolderIdentity: &s.node},
	}
	// A pod's address goes with its Node: the cluster's garbage collector
	// deletes the Lease with it. A Service's belongs to the cluster and
	// stays, whichever node wrote it.
	if c.Owner.Kind() == store.OwnerPod {
		if ref, ok := s.nodeRef(ctx); ok {
			l.OwnerReferences = []metav1.OwnerReference{ref}
		}
	}
	won := false
	err := s.op(ctx, "claiming "+c.IP.String()+" (Lease "+l.Name+")", func(ctx context.Context) error {
		_, err := s.leases().Create(ctx, l, metav1.CreateOptions{FieldManager: "village-ipam"})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		won = err == nil
		return err
	})
	if err != nil || !won {
		return false, err
	}
	s.setLast(ctx, c.RangeSet, c.IP)
	return true, nil
}

// nodeRef is an ownerReference to this node's Node, when it can be read.
func (s *Store) nodeRef(ctx context.Context) (metav1.OwnerReference, bool) {
	uid, err := s.nodeUID(ctx, s.node)
	if err != nil {
		return metav1.OwnerReference{}, false
	}
	return metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: s.node, UID: uid}, true
}

// nodeUID reads the UID of Node name (through op: bounded by the store's
// timeout, the error naming what it was doing).
func (s *Store) nodeUID(ctx context.Context, name string) (types.UID, error) {
	var uid types.UID
	err := s.op(ctx, "reading Node "+name, func(ctx context.Context) error {
		n, err := s.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			uid = n.UID
		}
		return err
	})
	return uid, err
}

// setLast records ip as the last reservation of rangeSet. It is a hint:
// a lost race only moves where the next search starts.
func (s *Store) setLast(ctx context.Context, rangeSet int, ip netip.Addr) {
	name := s.lastName(rangeSet)
	v := ip.String()
	_ = s.op(ctx, "recording the last reservation", func(ctx context.Context) error {
		l, err := s.leases().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = s.leases().Create(ctx, &coordv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelNetwork: s.netHash, labelKind: "last"}},
				Spec:       coordv1.LeaseSpec{HolderIdentity: &v},
			}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = &v
		_, err = s.leases().Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
}

// entry is one allocation as read.
type entry struct {
	store.Allocation
	node string
	uid  types.UID
	rv   string
	refs []metav1.OwnerReference
}

func (s *Store) decode(l *coordv1.Lease) (entry, bool) {
	a := l.Annotations
	ip, err := netip.ParseAddr(a[annIP])
	if err != nil || a[annNetwork] != s.net || l.Name != s.name(ip) {
		return entry{}, false
	}
	return entry{Allocation: store.Allocation{IP: ip, Owner: store.Owner{ContainerID: a[annContainer], IfName: a[annIfName]}},
		node: a[annNode], uid: l.UID, rv: l.ResourceVersion, refs: l.OwnerReferences}, true
}

func (s *Store) list(ctx context.Context, extra map[string]string) ([]entry, error) {
	sel := map[string]string{labelNetwork: s.netHash, labelKind: "address"}
	for k, v := range extra {
		sel[k] = v
	}
	var ls *coordv1.LeaseList
	err := s.op(ctx, "listing the allocations of network "+s.net, func(ctx context.Context) error {
		var err error
		ls, err = s.leases().List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()})
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []entry
	for i := range ls.Items {
		if e, ok := s.decode(&ls.Items[i]); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// Release deletes ip's Lease if owner holds it (a delete preconditioned
// on the UID and resourceVersion of the Lease whose owner was checked).
func (s *Store) Release(ctx context.Context, ip netip.Addr, o store.Owner) (bool, error) {
	var l *coordv1.Lease
	err := s.op(ctx, "reading the allocation of "+ip.String(), func(ctx context.Context) error {
		var err error
		l, err = s.leases().Get(ctx, s.name(ip), metav1.GetOptions{})
		return err
	})
	if err != nil {
		if apierrors.IsNotFound(errors.Unwrap(err)) || apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	e, ok := s.decode(l)
	if !ok || e.Owner != o {
		return false, nil
	}
	return s.delete(ctx, e)
}

func (s *Store) delete(ctx context.Context, e entry) (bool, error) {
	deleted := false
	err := s.op(ctx, "releasing "+e.IP.String(), func(ctx context.Context) error {
		err := s.leases().Delete(ctx, s.name(e.IP), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &e.uid, ResourceVersion: &e.rv}})
		switch {
		case err == nil:
			deleted = true
			return nil
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			return nil // gone, or changed hands since it was read
		}
		return err
	})
	return deleted, err
}

// ListByOwner lists owner's addresses (a label-selected list).
func (s *Store) ListByOwner(ctx context.Context, o store.Owner) ([]netip.Addr, error) {
	es, err := s.list(ctx, map[string]string{labelOwner: ownerHash(o)})
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, e := range es {
		if e.Owner == o {
			out = append(out, e.IP)
		}
	}
	return out, nil
}

// List returns every allocation of the network.
func (s *Store) List(ctx context.Context) ([]store.Allocation, error) {
	es, err := s.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := make([]store.Allocation, 0, len(es))
	for _, e := range es {
		out = append(out, e.Allocation)
	}
	return out, nil
}

// LastReserved reads range set rangeSet's marker.
func (s *Store) LastReserved(ctx context.Context, rangeSet int) (netip.Addr, error) {
	var l *coordv1.Lease
	err := s.op(ctx, "reading the last reservation", func(ctx context.Context) error {
		var err error
		l, err = s.leases().Get(ctx, s.lastName(rangeSet), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			l, err = nil, nil
		}
		return err
	})
	if err != nil || l == nil || l.Spec.HolderIdentity == nil {
		return netip.Addr{}, err
	}
	ip, err := netip.ParseAddr(*l.Spec.HolderIdentity)
	if err != nil {
		return netip.Addr{}, nil // a damaged hint: start from the beginning
	}
	return ip, nil
}

// GC releases this node's allocations whose owner keep does not keep, and
// any node's pod allocations whose Node has been deleted. A Service's
// allocation is never released for its writer's Node: its Service, not a
// node, holds it.
func (s *Store) GC(ctx context.Context, keep func(store.Owner) bool) ([]store.Allocation, error) {
	es, err := s.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	gone := map[types.UID]bool{}
	var released []store.Allocation
	var errs []error
	for _, e := range es {
		switch {
		case e.node == s.node:
			if keep(e.Owner) {
				continue
			}
		case e.Owner.Kind() == store.OwnerService || !s.nodeGone(ctx, e.refs, gone):
			continue
		}
		ok, err := s.delete(ctx, e)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			released = append(released, e.Allocation)
		}
	}
	return released, errors.Join(errs...)
}

// nodeGone: the allocation's owning Node no longer exists (by UID). An
// allocation without an owning Node is never taken for gone.
func (s *Store) nodeGone(ctx context.Context, refs []metav1.OwnerReference, cache map[types.UID]bool) bool {
	for _, r := range refs {
		if r.Kind != "Node" || r.APIVersion != "v1" {
			continue
		}
		if g, ok := cache[r.UID]; ok {
			return g
		}
		uid, err := s.nodeUID(ctx, r.Name)
		g := (err != nil && apierrors.IsNotFound(errors.Unwrap(err))) || (err == nil && uid != r.UID)
		cache[r.UID] = g
		return g
	}
	return false
}

// Close does nothing: the client holds no connection that needs closing.
func (s *Store) Close() error { return nil }
