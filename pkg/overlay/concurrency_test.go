package overlay_test

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// TestConcurrentCalls: Set, Status and Teardown from many goroutines on one
// Reconciler are serialized (run with -race), and the last Set wins cleanly.
func TestConcurrentCalls(t *testing.T) {
	s := newScaleNode(t)
	peers := fakePeers(50)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			var err error
			switch i % 3 {
			case 0:
				_, err = s.r.Set(ctx, s.self, peers[:10+i])
			case 1:
				_, err = s.r.Status(ctx, s.self, peers)
			case 2:
				_, err = s.r.Teardown(ctx)
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	s.set(t, peers)
	if d, err := s.r.Status(context.Background(), s.self, peers); err != nil || !d.Clean() {
		t.Errorf("Status after the final Set: %v, %v", d, err)
	}
}

// TestCanceledContext: a canceled Set writes nothing and says why.
func TestCanceledContext(t *testing.T) {
	s := newScaleNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := s.r.Set(ctx, s.self, fakePeers(5))
	if !errors.Is(err, context.Canceled) || len(rep.Applied) != 0 {
		t.Errorf("canceled Set: applied %v, err %v", rep.Applied, err)
	}
	if _, err := s.r.Teardown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.r.Set(context.Background(), s.self, nil); err == nil {
		t.Error("Set after Close succeeded")
	}
}
