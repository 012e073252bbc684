package cleanup

import (
	"errors"
	"strings"
	"testing"
)

func TestRunOrderAndErrors(t *testing.T) {
	var s Stack
	var order []string
	s.Push("a", func() error { order = append(order, "a"); return nil })
	s.Push("b", func() error { order = append(order, "b"); return errors.New("boom") })
	s.Push("c", func() error { order = append(order, "c"); return nil })
	err := s.Run()
	if got := strings.Join(order, ""); got != "cba" {
		t.Fatalf("undo order %q, want cba", got)
	}
	if err == nil || !strings.Contains(err.Error(), "rollback: b: boom") {
		t.Fatalf("error %v does not name the failed step", err)
	}
	if s.Run() != nil || len(order) != 3 {
		t.Fatal("stack not emptied after Run")
	}
}

type codedErr struct{ code int }

func (c *codedErr) Error() string { return "coded" }

func TestRunIfFailed(t *testing.T) {
	ran := false
	func() {
		var s Stack
		var err error
		defer s.RunIfFailed(&err)
		s.Push("x", func() error { ran = true; return nil })
	}()
	if ran {
		t.Fatal("rollback ran on success")
	}

	var s Stack
	s.Push("x", func() error { return errors.New("undo failed") })
	var err error = &codedErr{code: 7}
	s.RunIfFailed(&err)
	var ce *codedErr
	if !errors.As(err, &ce) || ce.code != 7 {
		t.Fatalf("original error lost: %v", err)
	}
	if !strings.Contains(err.Error(), "undo failed") {
		t.Fatalf("rollback failure not reported: %v", err)
	}
}
