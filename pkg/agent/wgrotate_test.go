package agent

import (
	"testing"
	"time"
)

// keyRotation asks for a new key once the key is that old, never when 0.
func TestRotationDue(t *testing.T) {
	made := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		period time.Duration
		now    time.Time
		want   bool
	}{
		{0, made.Add(10000 * time.Hour), false},
		{time.Hour, made.Add(59 * time.Minute), false},
		{time.Hour, made.Add(time.Hour), true},
		{time.Hour, made.Add(5 * time.Hour), true},
	} {
		rt := &rotator{period: tc.period, status: KeyStatus{Since: made}}
		if got := rt.due(tc.now); got != tc.want {
			t.Errorf("period %v, key %v old: due %v, want %v", tc.period, tc.now.Sub(made), got, tc.want)
		}
	}
}
