// Package masq keeps the netfilter rules a Village network needs on a node:
// the source NAT that lets pods reach the world (ONE rule set per network and
// IP family, shared by every pod of that network, instead of the reference
// plugins' chain per container) and, on hosts whose forwarding policy drops
// (Docker's `iptables -P FORWARD DROP`, firewalld), accept rules for traffic
// from and to the pod network.
//
// Two backends hold the same rules:
//
//   - "nftables" programs nf_tables over netlink, with no exec: a table
//     `inet village-<network>` owned by the network (chain postrouting, nat,
//     priority srcnat), plus rules tagged "village:<network>" inserted at the
//     top of every other table's forward base chain when forwardAccept is on
//     (an accept in our own chain cannot overrule another chain's drop).
//   - "iptables" runs iptables/ip6tables (go-iptables), see iptables.go:
//     nat POSTROUTING jumps to VLG-MASQ-<hash>, filter FORWARD jumps to
//     VLG-FWD-<hash>, every rule carrying the comment "village:<network>".
//
// Resolve picks the backend when the config names none: iptables on hosts
// whose iptables is the legacy variant (their FORWARD drop lives in legacy
// x_tables, out of nf_tables' reach), nftables on iptables-nft hosts and on
// hosts without iptables at all.
//
// Keep (keep.go) is the one entry point that keeps the rules right, for the
// plugin's ADD and for villaged alike: it compares the stamp recorded on the
// network's bridge with the host's netfilter fingerprint (the nf_tables
// ruleset generation ID, plus the legacy tables' entry counts for the
// iptables backend), looks at the rules again only when something changed
// since, repairs what is gone (the pods' macspoofchk rules too) and records
// the new stamp. Check reports the same state and writes nothing (CHECK,
// `villaged status`); Orphans lists what no network uses any more; Ensure
// installs without a stamp, Teardown removes both backends' rules of a
// network, found by name and owner tag.
package masq

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/owner"
)

// Backends.
const (
	IPTables = "iptables"
	NFTables = "nftables"
)

// LockFile serialises the slow path across concurrent plugin processes.
// It is deliberately node-wide, not under $VILLAGE_RUN_DIR (nodelocal):
// what it guards is kernel state (the iptables chains and nftables tables
// of the namespace the process runs in, and the xtables lock they share),
// which has nothing to do with the run directory a process was given. Two
// processes with different run directories may edit the same namespace's
// tables, so they must take the same lock, as iptables' own
// /run/xtables.lock is one per host.
const LockFile = "/run/village/masq.lock"

// Spec is the netfilter state wanted for one network.
type Spec struct {
	Network string
	// PodSubnets are the node's pod subnets of this network (any family).
	PodSubnets []*net.IPNet
	// Cluster is the whole pod network per family; a family without one
	// falls back to its pod subnet.
	Cluster []*net.IPNet
	// Backend is IPTables, NFTables or "" (Resolve decides).
	Backend string
	// ForwardAccept adds the accept rules for forwarded traffic from and to
	// the pod network (Cluster, else PodSubnets).
	ForwardAccept bool
	// NoMasquerade leaves the source NAT out (ipMasq off): only the forward
	// rules are kept.
	NoMasquerade bool
	// SpoofCheck: the pods' macspoofchk rules are kept too (Keep puts back
	// the rule of every port of the bridge). Not part of Stamp: those rules
	// are per pod, recorded under nodelocal.SpoofDir.
	SpoofCheck bool
}

// Wants reports whether the network keeps any netfilter state on a node.
func (s Spec) Wants() bool { return s.WantsRules() || s.SpoofCheck }

// WantsRules: the network has masquerade or forward accept rules.
func (s Spec) WantsRules() bool { return !s.NoMasquerade || s.ForwardAccept }

// Chain returns the per-network masquerade chain name of the iptables
// backend (iptables allows 28 characters).
func Chain(network string) string {
	return "VLG-MASQ-" + netHash(network)
}

// ForwardChain is the iptables backend's per-network filter chain.
func ForwardChain(network string) string {
	return "VLG-FWD-" + netHash(network)
}

// Table is the nftables backend's per-network table (family inet, and
// bridge for macspoofchk): owner.Table's masquerade table.
func Table(network string) string { return owner.Table(owner.Masquerade, network) }

func netHash(network string) string {
	sum := sha256.Sum256([]byte(network))
	return strings.ToUpper(hex.EncodeToString(sum[:8]))
}

// Comment is the owner tag on every rule of the network.
func Comment(network string) string {
	c := "village:" + network
	if len(c) > 200 {
		c = c[:200]
	}
	return c
}

// Stamp is a short digest of the spec: "m", four hex digits naming the
// network, then the digest of everything else. Callers store it (with a
// fingerprint, see Keep) to skip work when nothing changed.
func (s Spec) Stamp() string {
	n := sha256.Sum256([]byte(s.Network))
	h := sha256.New()
	h.Write([]byte(s.Network))
	for _, c := range append(slices.Clone(s.PodSubnets), s.Cluster...) {
		h.Write([]byte("|" + c.String()))
	}
	if s.Backend != "" || s.ForwardAccept || s.NoMasquerade {
		fmt.Fprintf(h, "|%s|%t|%t", s.Backend, s.ForwardAccept, s.NoMasquerade)
	}
	return "m" + hex.EncodeToString(n[:2]) + hex.EncodeToString(h.Sum(nil)[:6])
}

// StampNetwork is the part of Stamp that names the network: stamps of one
// network share it.
func StampNetwork(stamp string) string {
	if len(stamp) < 5 {
		return stamp
	}
	return stamp[:5]
}

// keep is what masquerade skips and forwardAccept accepts, per family: the
// cluster network, else the pod subnets.
func (s Spec) keep(v4 bool) []*net.IPNet {
	for _, c := range s.Cluster {
		if (c.IP.To4() != nil) == v4 {
			return []*net.IPNet{c}
		}
	}
	return s.subnets(v4)
}

func (s Spec) subnets(v4 bool) []*net.IPNet {
	var out []*net.IPNet
	for _, sn := range s.PodSubnets {
		if (sn.IP.To4() != nil) == v4 {
			out = append(out, sn)
		}
	}
	return out
}

// backend is one way of holding the rules.
type backend interface {
	ensure(Spec) error
	check(Spec) error
	teardown(network string) error
}

func pick(name string) (backend, error) {
	switch name {
	case IPTables:
		return iptBackend{}, nil
	case NFTables:
		return nftBackend{}, nil
	}
	return nil, fmt.Errorf("unknown netfilter backend %q (want %q or %q)", name, IPTables, NFTables)
}

// Ensure installs the network's rules with its backend and removes whatever
// the other backend holds for the network (a switched backend leaves nothing
// behind).
func Ensure(s Spec) error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	return ensureLocked(s)
}

func ensureLocked(s Spec) error { return ensureWith(Resolve(s.Backend), s) }

// ensureWith installs s in backend name and clears the other backend.
func ensureWith(name string, s Spec) error {
	b, err := pick(name)
	if err != nil {
		return err
	}
	if err := b.ensure(s); err != nil {
		return err
	}
	return teardownOthers(name, s.Network)
}

// teardownOthers removes the network's rules from every backend but keep.
// The iptables backend is skipped, without running anything, when it cannot
// hold rules of the network (see iptMaybePresent).
func teardownOthers(keep, network string) error {
	var errs []error
	for _, name := range []string{IPTables, NFTables} {
		if name == keep || (name == IPTables && !iptMaybePresent(network)) {
			continue
		}
		b, _ := pick(name)
		if err := b.teardown(network); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove the %s rules of network %q after switching to %s: %w", name, network, keep, err))
		}
	}
	return errors.Join(errs...)
}

// Teardown removes the network's rules from both backends (found by name
// and owner tag) and its macspoofchk table. Absent rules are fine.
func Teardown(network string) error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	return errors.Join(teardownOthers("", network), deleteSpoofTable(network), os.RemoveAll(nodelocal.SpoofDir("", network)))
}

// syncRules makes sure the rules of s are in place in backend name, with
// the lock held, when the stamp prev (the one recorded on the bridge, ""
// when unknown) does not cover the fingerprint Keep read: the rules are
// read again and repaired; a different spec (or none) is installed in
// full, which is not drift: nothing said the rules were complete. The
// fingerprint recorded is the one read before the look that found the
// rules complete, so a change racing with syncRules is seen next time.
func syncRules(s Spec, name, digest, prev string) (Result, error) {
	b, err := pick(name)
	if err != nil {
		return Result{}, err
	}
	res := Result{Looked: true}
	if !strings.HasPrefix(prev, digest) {
		// A new spec or resolved backend: install in full, clear the other.
		if b.check(s) == nil {
			// Complete already (villaged looks again without a bridge to
			// keep a stamp on): only the other backend is cleared.
			if err := teardownOthers(name, s.Network); err != nil {
				return Result{}, err
			}
		} else {
			res.Installed = true
			if err := ensureWith(name, s); err != nil {
				return Result{}, err
			}
		}
	}
	for range 3 {
		fp := Fingerprint(name)
		drift := b.check(s)
		if drift == nil {
			res.Stamp = digest + fp
			return res, nil
		}
		if res.Repaired == "" {
			res.Repaired = drift.Error()
		}
		if err := b.ensure(s); err != nil {
			return Result{}, fmt.Errorf("failed to repair the %s rules of network %q (%v): %w", name, s.Network, drift, err)
		}
	}
	return Result{}, fmt.Errorf("the %s rules of network %q changed again after each of 3 repairs: %s", name, s.Network, res.Repaired)
}

// JoinLine joins errors on one line, "; " between them (CNI messages end
// up in single-line runtime logs and events); nil when there are none.
func JoinLine(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// lockWait bounds how long lock waits for LockFile.
const lockWait = 30 * time.Second

// lock takes an exclusive flock on LockFile, waiting at most lockWait. The
// wait blocks in the kernel, which wakes the waiters when the holder lets
// go: a waiter costs no CPU (a poll every few milliseconds by a hundred
// concurrent ADDs took the holder's CPU away from it), and hands the lock
// on without sleeping in between. A wait that times out leaves its flock
// call behind; when that call returns, the file is closed at once, so the
// lock is never held by nobody.
func lock() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(LockFile), 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", filepath.Dir(LockFile), err)
	}
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open lock %s: %w", LockFile, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return func() { _ = f.Close() }, nil
	}
	got := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if !errors.Is(err, syscall.EINTR) {
				got <- err
				return
			}
		}
	}()
	t := time.NewTimer(lockWait)
	defer t.Stop()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("failed to lock %s: %w", LockFile, err)
		}
		return func() { _ = f.Close() }, nil
	case <-t.C:
		go func() { <-got; f.Close() }()
		return nil, fmt.Errorf("failed to lock %s: still held by another process after %v", LockFile, lockWait)
	}
}

// Present lists the network's netfilter objects on the node, in both
// backends ("iptables nat chain VLG-MASQ-…", "nftables table inet
// village-…", "nftables rules in ip filter FORWARD", ...).
func Present(network string) []string {
	var out []string
	if Detect().IPTables != "" {
		out = append(out, iptPresent(network)...)
	}
	return append(out, nftPresent(network)...)
}
