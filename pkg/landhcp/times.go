package landhcp

import (
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// times are a lease's deadlines, from the ACK's options (RFC 2131 4.4.5
// defaults when the server sends no T1/T2: half and seven eighths of the
// lease).
type times struct {
	Renew, Rebind, Expires time.Time
}

// defaultLease is assumed when an ACK names no lease time (a server must;
// one that does not gets the common default rather than forever).
const defaultLease = time.Hour

func leaseTimes(ack *dhcpv4.DHCPv4, at time.Time) times {
	lease := ack.IPAddressLeaseTime(defaultLease)
	t1 := ack.IPAddressRenewalTime(lease / 2)
	t2 := ack.IPAddressRebindingTime(lease * 7 / 8)
	// A server's odd values are clamped to the order the RFC requires:
	// T1 <= T2 <= lease.
	if t2 > lease {
		t2 = lease * 7 / 8
	}
	if t1 > t2 {
		t1 = t2
	}
	return times{Renew: at.Add(t1), Rebind: at.Add(t2), Expires: at.Add(lease)}
}

// phase is where a lease is in its life.
type phase int

const (
	bound     phase = iota // before T1: nothing to do
	renewing               // T1..T2: ask the server that granted it
	rebinding              // T2..expiry: ask any server
	expired                // the address may no longer be used
)

func (p phase) String() string {
	return [...]string{"bound", "renewing", "rebinding", "expired"}[p]
}

func (t times) phaseAt(now time.Time) phase {
	switch {
	case now.Before(t.Renew):
		return bound
	case now.Before(t.Rebind):
		return renewing
	case now.Before(t.Expires):
		return rebinding
	}
	return expired
}

// minRetry is the shortest pause between two failed attempts of one phase.
const minRetry = time.Second

// maxRetry bounds the pause after failures once the lease has expired.
const maxRetry = time.Minute

// nextAttempt is when to try next at now, after failures of phase p
// (tried) or not yet: the phase's start when it is ahead; at once for a
// phase not yet tried; else half the time left until the phase ends (RFC
// 2131 4.4.5), at least minRetry and never past the phase's end. An
// expired lease is tried again with a doubling pause up to maxRetry
// (last is the previous pause).
func (t times) nextAttempt(now time.Time, tried bool, last time.Duration) (time.Time, time.Duration) {
	p := t.phaseAt(now)
	if p == bound {
		return t.Renew, 0
	}
	if !tried {
		return now, 0
	}
	if p == expired {
		d := min(max(2*last, minRetry), maxRetry)
		return now.Add(d), d
	}
	end := t.Rebind
	if p == rebinding {
		end = t.Expires
	}
	d := max(end.Sub(now)/2, minRetry)
	at := now.Add(d)
	if at.After(end) {
		at = end
	}
	return at, d
}
