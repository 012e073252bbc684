package masq

import (
	"errors"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Node says where Keep and Check work: the network's bridge on this node,
// and who asks.
type Node struct {
	// Bridge is the network's bridge. Its ifalias carries the stamp (see
	// stamp.go), its ports are the pods whose macspoofchk rules Keep puts
	// back. It may not exist yet: villaged runs before the first ADD.
	Bridge string
	// Agent is set by villaged, which may run in a container whose iptables
	// is not the node's: when the spec leaves the backend to automatic
	// choice, the rules stay in the backend the plugin's stamp names.
	Agent bool
	// RunDir is the run directory whose records of the pods' source checks
	// Keep puts back (nodelocal.SpoofDir); "" is $VILLAGE_RUN_DIR or
	// /run/village, where the plugins write them.
	RunDir string
}

// Result says what Keep did.
type Result struct {
	// Stamp is what Keep recorded on the bridge ("" without a bridge).
	Stamp string
	// Looked is true when the rules were read again (no stamp, another
	// spec, or the fingerprint moved).
	Looked bool
	// Installed: no stamp of this spec said the rules were complete (a new
	// bridge, a changed spec, villaged before the first ADD), and they were
	// not: they have been installed. That is not drift.
	Installed bool
	// Repaired names what was missing although the stamp said the rules
	// were complete, and has been put back ("" if nothing): drift.
	Repaired string
	// SpoofRestored are the host veths whose macspoofchk rule was gone and
	// has been put back: drift too.
	SpoofRestored []string
}

// Drift is the number of pieces Keep found changed behind Village's back
// (the rule set counts once).
func (r Result) Drift() int {
	n := len(r.SpoofRestored)
	if r.Repaired != "" {
		n++
	}
	return n
}

// Keep is the one way Village keeps a network's netfilter state right on a
// node, used by the plugin's ADD and by villaged (its loop and `sync`): the
// masquerade and forward accept rules of s, and the macspoofchk rule of
// every pod port on the bridge. It costs one read of the netfilter
// fingerprint when nothing changed since the stamp on the bridge was
// recorded; otherwise, under the node-wide lock, it reads the rules,
// repairs what is gone, puts back the pods' macspoofchk rules and records
// the new stamp, unless a stamp recorded while it waited for the lock
// covers the fingerprint it read (see covers). A network that wants no
// netfilter state is left alone.
func Keep(s Spec, at Node) (Result, error) {
	if !s.Wants() {
		return Result{}, nil
	}
	key := StampNetwork(s.Stamp())
	br, err := bridgeOf(at.Bridge)
	if err != nil {
		return Result{}, err
	}
	prev := FindStamp(aliasOf(br), key)
	name := at.backend(s, prev)
	dg := digest(s, name)
	seen := Fingerprint(name)
	if covers(prev, dg, seen) {
		return Result{Stamp: prev}, nil
	}
	unlock, err := lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	// The stamp again, now that no one else can write it: while this Keep
	// waited for the lock, another (an ADD beside it, villaged) may have
	// looked after seen was read. A hundred ADDs at once on a node whose
	// ruleset others keep changing then make a few looks, not a hundred.
	if br != nil {
		if br, err = bridgeOf(at.Bridge); err != nil {
			return Result{}, err
		}
		prev = FindStamp(aliasOf(br), key)
		if covers(prev, dg, seen) {
			return Result{Stamp: prev}, nil
		}
	}
	res, err := syncRules(s, name, dg, prev)
	if err != nil {
		return res, err
	}
	if br == nil {
		res.Stamp = "" // nowhere to record it: the next Keep looks again
		return res, nil
	}
	if s.SpoofCheck {
		restored, err := restoreSpoofChecks(s.Network, br.Attrs().Index, at.RunDir)
		res.SpoofRestored = restored
		if err != nil {
			return res, err
		}
	}
	if err := netlink.LinkSetAlias(br, SetStamp(aliasOf(br), res.Stamp)); err != nil {
		return res, fmt.Errorf("failed to record the netfilter stamp on bridge %q: %w", at.Bridge, err)
	}
	return res, nil
}

// aliasOf is the bridge's ifalias, "" without a bridge.
func aliasOf(br netlink.Link) string {
	if br == nil {
		return ""
	}
	return br.Attrs().Alias
}

// Check reports, writing nothing, every missing or changed piece of the
// network's netfilter state, naming it on one line: its rules when it wants
// masquerade or forward accept rules, and the macspoofchk rule of each
// port given. It is what CHECK and `villaged status` report; Keep repairs.
func Check(s Spec, at Node, ports ...SpoofCheck) error {
	var errs []error
	if s.WantsRules() {
		prev := ""
		if br, err := bridgeOf(at.Bridge); err != nil {
			return err
		} else if br != nil {
			prev = FindStamp(br.Attrs().Alias, StampNetwork(s.Stamp()))
		}
		b, err := pick(at.backend(s, prev))
		if err != nil {
			return err
		}
		if err := b.check(s); err != nil {
			errs = append(errs, err)
		}
	}
	for _, sc := range ports {
		if err := CheckSpoofCheck(sc); err != nil {
			errs = append(errs, err)
		}
	}
	return JoinLine(errs)
}

// backend is the backend the rules of s live in: the configured one, for
// villaged the one the plugin's stamp prev names, else Resolve's choice.
func (at Node) backend(s Spec, prev string) string {
	if at.Agent && s.Backend == "" {
		if b := StampBackend(prev); b != "" {
			return b
		}
	}
	return Resolve(s.Backend)
}

// bridgeOf looks the bridge up; nil when there is none (or no name).
func bridgeOf(name string) (netlink.Link, error) {
	if name == "" {
		return nil, nil
	}
	l, err := netlinksafe.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to look up bridge %q: %w", name, err)
	}
	return l, nil
}
