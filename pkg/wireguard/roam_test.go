package wireguard

import (
	"net"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// A peer heard from within RoamFresh keeps the endpoint its packets came
// from (a node behind NAT, which cannot publish its NAT's port); a silent
// one, or one never heard from, gets the given endpoint back.
func TestSamePeerKeepsLearntEndpoint(t *testing.T) {
	now := time.Now()
	_, subnet, _ := net.ParseCIDR("10.70.3.0/24")
	published := &net.UDPAddr{IP: net.ParseIP("10.79.0.13").To4(), Port: 51820}
	natted := &net.UDPAddr{IP: net.ParseIP("10.78.0.2").To4(), Port: 21767}
	want := Peer{Endpoint: published, AllowedIPs: []net.IPNet{*subnet}, PersistentKeepalive: 25 * time.Second}
	for _, c := range []struct {
		name      string
		handshake time.Time
		endpoint  *net.UDPAddr
		same      bool
	}{
		{"heard now, at the NAT's port", now.Add(-5 * time.Second), natted, true},
		{"heard just within RoamFresh", now.Add(-RoamFresh + time.Second), natted, true},
		{"silent longer than RoamFresh", now.Add(-RoamFresh - time.Second), natted, false},
		{"never heard from", time.Time{}, natted, false},
		{"at the published endpoint", time.Time{}, published, true},
	} {
		h := wgtypes.Peer{Endpoint: c.endpoint, AllowedIPs: []net.IPNet{*subnet}, LastHandshakeTime: c.handshake,
			PersistentKeepaliveInterval: 25 * time.Second}
		if got := samePeer(h, want, heardFrom(h, now)); got != c.same {
			t.Errorf("%s: samePeer = %v, want %v", c.name, got, c.same)
		}
	}
	// Allowed IPs still count when roamed.
	h := wgtypes.Peer{Endpoint: natted, LastHandshakeTime: now, PersistentKeepaliveInterval: 25 * time.Second}
	if samePeer(h, want, heardFrom(h, now)) {
		t.Errorf("a roamed peer without its allowed IPs counts as the same")
	}
}
