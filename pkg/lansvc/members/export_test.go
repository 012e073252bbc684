package members

import "time"

// SetClock makes m's settle and alone waits read now, and measures the
// alone wait from now's present: a test moves the clock instead of
// sleeping.
func SetClock(m *Members, now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = now
	m.waiting = now()
}

// Rejoin runs one pass of the rejoin loop (which also settles a node
// alone) at once.
func Rejoin(m *Members) { m.rejoin() }
