package landhcp

import (
	"net"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

func ack(t *testing.T, opts ...dhcpv4.Option) *dhcpv4.DHCPv4 {
	t.Helper()
	mods := []dhcpv4.Modifier{dhcpv4.WithMessageType(dhcpv4.MessageTypeAck), dhcpv4.WithYourIP(net.IPv4(192, 168, 77, 120))}
	for _, o := range opts {
		mods = append(mods, dhcpv4.WithOption(o))
	}
	m, err := dhcpv4.New(mods...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The lease's deadlines: the server's T1/T2 when it sends them, RFC 2131's
// defaults (1/2, 7/8) when not, clamped into order when they are odd.
func TestLeaseTimes(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name             string
		opts             []dhcpv4.Option
		t1, t2, lifetime time.Duration
	}{
		{"defaults", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(time.Hour)}, 30 * time.Minute, 52*time.Minute + 30*time.Second, time.Hour},
		{"server's T1 and T2", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(2 * time.Minute), dhcpv4.OptRenewTimeValue(3 * time.Second), dhcpv4.OptRebindingTimeValue(100 * time.Second)},
			3 * time.Second, 100 * time.Second, 2 * time.Minute},
		{"T2 past the lease", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(80 * time.Second), dhcpv4.OptRebindingTimeValue(time.Hour)}, 40 * time.Second, 70 * time.Second, 80 * time.Second},
		{"T1 past T2", []dhcpv4.Option{dhcpv4.OptIPAddressLeaseTime(80 * time.Second), dhcpv4.OptRenewTimeValue(75 * time.Second), dhcpv4.OptRebindingTimeValue(60 * time.Second)}, 60 * time.Second, 60 * time.Second, 80 * time.Second},
		{"no lease time", nil, 30 * time.Minute, 52*time.Minute + 30*time.Second, defaultLease},
	} {
		got := leaseTimes(ack(t, tc.opts...), at)
		want := times{Renew: at.Add(tc.t1), Rebind: at.Add(tc.t2), Expires: at.Add(tc.lifetime)}
		if got != want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, want)
		}
	}
}

// When the maintainer tries next: at T1; at once on entering a phase; then
// half the phase's remaining time (never past its end, at least a
// second); after expiry a doubling pause up to a minute.
func TestNextAttempt(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lt := times{Renew: at.Add(60 * time.Second), Rebind: at.Add(105 * time.Second), Expires: at.Add(120 * time.Second)}
	for _, tc := range []struct {
		name  string
		now   time.Duration
		tried bool
		last  time.Duration
		want  time.Duration // from at
		pause time.Duration
	}{
		{"bound: wait for T1", 10 * time.Second, false, 0, 60 * time.Second, 0},
		{"renewing, first try: now", 61 * time.Second, false, 0, 61 * time.Second, 0},
		{"renewing, retry: half the way to T2", 65 * time.Second, true, 0, 85 * time.Second, 20 * time.Second},
		{"renewing, retry close to T2: not past it", 104*time.Second + 500*time.Millisecond, true, 0, 105 * time.Second, time.Second},
		{"rebinding, first try: now", 106 * time.Second, false, 0, 106 * time.Second, 0},
		{"rebinding, retry: half the way to expiry", 110 * time.Second, true, 0, 115 * time.Second, 5 * time.Second},
		{"expired, first try: now", 130 * time.Second, false, 0, 130 * time.Second, 0},
		{"expired, retry: a second", 130 * time.Second, true, 0, 131 * time.Second, time.Second},
		{"expired, retry: doubled", 130 * time.Second, true, 8 * time.Second, 146 * time.Second, 16 * time.Second},
		{"expired, retry: at most a minute", 130 * time.Second, true, 50 * time.Second, 190 * time.Second, time.Minute},
	} {
		next, pause := lt.nextAttempt(at.Add(tc.now), tc.tried, tc.last)
		if !next.Equal(at.Add(tc.want)) || pause != tc.pause {
			t.Errorf("%s: next %s pause %s, want %s pause %s", tc.name, next.Sub(at), pause, tc.want, tc.pause)
		}
	}
}
