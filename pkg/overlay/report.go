package overlay

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Op is what a change does to a kernel object.
type Op string

// The operations.
const (
	OpAdd     Op = "add"     // missing: created
	OpReplace Op = "replace" // present but different: corrected in place
	OpDelete  Op = "delete"  // owned but no longer wanted: removed
)

// Kind is the kind of a kernel object.
type Kind string

// The kinds of objects the reconciler manages.
const (
	KindDevice  Kind = "device"
	KindAddress Kind = "address"
	KindRoute   Kind = "route"
	KindNeigh   Kind = "neigh"
	KindFDB     Kind = "fdb"
)

// Object names one kernel object, in `ip`-like words.
type Object struct {
	Kind Kind
	Desc string // e.g. "10.244.2.0/24 via 10.244.2.0 dev village.1 onlink"
	Peer string // the peer it serves; "" for device objects and stale ones
}

func (o Object) String() string {
	s := string(o.Kind) + " " + o.Desc
	if o.Peer != "" {
		s += " (peer " + o.Peer + ")"
	}
	return s
}

// Change is one difference between desired and kernel state.
type Change struct {
	Op     Op
	Object Object
}

func (c Change) String() string { return string(c.Op) + " " + c.Object.String() }

// Failure is a change that could not be applied, or a peer that could not be
// planned (then Change.Object names the peer's pod subnet).
type Failure struct {
	Change Change
	Err    error // wraps the kernel's error or a sentinel such as ErrOffSubnet
}

// Report is what Set or Teardown did.
type Report struct {
	Applied  []Change  // in the order applied
	Failed   []Failure // changes not applied; Err of Set joins theirs
	Device   string    // VXLAN device name; "" when the mode needs none
	Underlay string    // underlay interface used; "" in mode none
	MTU      int       // MTU for pod interfaces: the VXLAN device's, or the underlay's for host-gw
}

// Drift is what Status found: the changes Set would apply now.
type Drift struct {
	Changes  []Change
	Problems []Failure // peers that cannot be planned, conflicts
	Device   string
	Underlay string
	MTU      int
}

// Clean reports whether the kernel matches the desired state.
func (d Drift) Clean() bool { return len(d.Changes) == 0 && len(d.Problems) == 0 }

func (d Drift) String() string {
	if d.Clean() {
		return "in sync"
	}
	var b strings.Builder
	for _, c := range d.Changes {
		fmt.Fprintf(&b, "%s\n", c)
	}
	for _, p := range d.Problems {
		fmt.Fprintf(&b, "problem: %v\n", p.Err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// recorder runs changes (or, dry, only lists them) and keeps the outcome.
// Set and Status share every code path through it.
type recorder struct {
	ctx     context.Context
	dry     bool
	applied []Change
	failed  []Failure
	stopped error
	// once: the first failed write stops the rest (Repair: the Set that
	// must follow a failure writes them anyway).
	once bool
}

// do applies c with f. A failed change is recorded and its error returned;
// once the context is done nothing more runs.
func (rc *recorder) do(c Change, f func() error) error {
	return rc.doAs(c, func(*Change) error { return f() })
}

// doAs is do for a write that learns its op as it runs: f may change c.Op
// (an add that finds the object there and replaces it).
func (rc *recorder) doAs(c Change, f func(*Change) error) error {
	if rc.stopped != nil {
		return rc.stopped
	}
	if err := rc.ctx.Err(); err != nil {
		rc.stopped = fmt.Errorf("stopped before %s: %w", c, err)
		return rc.stopped
	}
	if !rc.dry {
		if err := f(&c); err != nil {
			return rc.fail(c, fmt.Errorf("%s: %w", c, err))
		}
	}
	rc.applied = append(rc.applied, c)
	return nil
}

// fail records a change that was not applied; err must name the object.
func (rc *recorder) fail(c Change, err error) error {
	rc.failed = append(rc.failed, Failure{Change: c, Err: err})
	if rc.once && rc.stopped == nil {
		rc.stopped = fmt.Errorf("stopped after the first failure (%s)", c)
	}
	return err
}

// err joins every failure (and a context stop) into one error, or nil.
func (rc *recorder) err() error {
	errs := make([]error, 0, len(rc.failed)+1)
	for _, f := range rc.failed {
		errs = append(errs, f.Err)
	}
	if rc.stopped != nil {
		errs = append(errs, rc.stopped)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("overlay: %d change(s) failed, %d applied: %w", len(rc.failed), len(rc.applied), errors.Join(errs...))
}
