// Package cleanup is a small rollback stack: each step that changes the
// system pushes the function that undoes it, and a failed operation runs the
// stack in reverse order before it returns its error.
package cleanup

import (
	"errors"
	"fmt"
)

// Stack holds undo functions; the zero value is ready to use. It is not safe
// for concurrent use: one operation owns one stack.
type Stack struct {
	steps []step
}

type step struct {
	what string
	undo func() error
}

// Push records how to undo what was just done; what names it for the error
// report ("delete host veth \"veth1234\"").
func (s *Stack) Push(what string, undo func() error) {
	s.steps = append(s.steps, step{what: what, undo: undo})
}

// Run undoes every recorded step, newest first, keeps going after a failed
// step, and returns the failures joined. The stack is empty afterwards.
func (s *Stack) Run() error {
	var errs []error
	for i := len(s.steps) - 1; i >= 0; i-- {
		if err := s.steps[i].undo(); err != nil {
			errs = append(errs, fmt.Errorf("rollback: %s: %w", s.steps[i].what, err))
		}
	}
	s.steps = nil
	return errors.Join(errs...)
}

// RunIfFailed is meant for defer: when *err is non-nil it rolls back and
// appends any rollback failure to *err, keeping the original error first so
// its CNI error code survives (errors.As finds it).
func (s *Stack) RunIfFailed(err *error) {
	if *err == nil {
		s.steps = nil
		return
	}
	if rbErr := s.Run(); rbErr != nil {
		*err = &rollbackError{cause: *err, rollback: rbErr}
	}
}

type rollbackError struct {
	cause, rollback error
}

func (e *rollbackError) Error() string {
	return fmt.Sprintf("%v (and rolling back failed: %v)", e.cause, e.rollback)
}

func (e *rollbackError) Unwrap() []error { return []error{e.cause, e.rollback} }
