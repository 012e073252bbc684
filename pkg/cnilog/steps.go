package cnilog

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// A verb's time split by step. A plugin process runs one verb, so the
// steps are kept per process: the verb calls Step as each of its steps
// ends, and the verb's log line carries them as "steps_ms" (name ->
// milliseconds, in the order they ran; a repeated name adds up). When the
// log is off, Step is one atomic load: the verbs call it unconditionally.
var steps struct {
	on   atomic.Bool
	mu   sync.Mutex
	list []step
}

type step struct {
	name string
	d    time.Duration
}

// Step records that the verb's step name took the time since start.
func Step(name string, start time.Time) {
	if !steps.on.Load() {
		return
	}
	d := time.Since(start)
	steps.mu.Lock()
	defer steps.mu.Unlock()
	for i := range steps.list {
		if steps.list[i].name == name {
			steps.list[i].d += d
			return
		}
	}
	steps.list = append(steps.list, step{name, d})
}

// startSteps turns recording on for one verb.
func startSteps() {
	steps.mu.Lock()
	steps.list = steps.list[:0]
	steps.mu.Unlock()
	steps.on.Store(true)
}

// endSteps turns recording off and returns the steps as a log attribute;
// ok is false when the verb recorded none.
func endSteps() (attr slog.Attr, ok bool) {
	steps.on.Store(false)
	steps.mu.Lock()
	defer steps.mu.Unlock()
	if len(steps.list) == 0 {
		return slog.Attr{}, false
	}
	attrs := make([]any, 0, len(steps.list))
	for _, s := range steps.list {
		attrs = append(attrs, slog.Float64(s.name, ms(s.d)))
	}
	return slog.Group("steps_ms", attrs...), true
}

// ms is d in milliseconds with microsecond precision.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
