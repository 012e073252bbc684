package wireguard

import (
	"net"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestChoosePaths(t *testing.T) {
	now := time.Now()
	key := func(b byte) wgtypes.Key { var k wgtypes.Key; k[0] = b; return k }
	self, a, b, h1, h2 := key(1), key(2), key(3), key(10), key(11)
	fresh := now.Add(-10 * time.Second)        // a live session
	stale := now.Add(-RoamFresh - time.Second) // a dead one
	old := now.Add(-RelayGrace - time.Second)  // came before the grace time
	peer := func(k wgtypes.Key, since, handshake time.Time) pathPeer {
		return pathPeer{key: k, keepalive: true, since: since, handshake: handshake}
	}
	hub := func(k wgtypes.Key, handshake time.Time) pathPeer {
		return pathPeer{key: k, hub: true, keepalive: true, since: old, handshake: handshake}
	}
	via := func(p pathPeer, h wgtypes.Key) pathPeer { p.via = h; return p }
	noKeepalive := func(p pathPeer) pathPeer { p.keepalive = false; return p }
	one := pickHub(self, a, []wgtypes.Key{h1, h2})
	for _, c := range []struct {
		name    string
		peers   []pathPeer
		relay   map[wgtypes.Key]wgtypes.Key
		pending bool
	}{
		{"no hub: all direct, nothing to watch", []pathPeer{peer(a, old, time.Time{}), peer(b, old, stale)}, nil, false},
		{"direct sessions live", []pathPeer{peer(a, old, fresh), hub(h1, fresh)}, nil, false},
		{"new peer within the grace time: direct, undecided", []pathPeer{peer(a, now, time.Time{}), hub(h1, fresh)}, nil, true},
		{"no handshake after the grace time: through the hub", []pathPeer{peer(a, old, time.Time{}), hub(h1, fresh)}, map[wgtypes.Key]wgtypes.Key{a: h1}, true},
		{"session dead for RoamFresh: through the hub", []pathPeer{peer(a, old, stale), hub(h1, fresh)}, map[wgtypes.Key]wgtypes.Key{a: h1}, true},
		{"already relayed, new to this process: stays relayed", []pathPeer{via(peer(a, now, time.Time{}), h1), hub(h1, fresh)}, map[wgtypes.Key]wgtypes.Key{a: h1}, true},
		{"relayed, then a direct handshake: direct again", []pathPeer{via(peer(a, old, fresh), h1), hub(h1, fresh)}, nil, false},
		{"the hub has no session: direct, waiting", []pathPeer{peer(a, old, time.Time{}), hub(h1, stale)}, nil, true},
		{"the hub never answered: direct, waiting", []pathPeer{peer(a, old, time.Time{}), hub(h1, time.Time{})}, nil, true},
		{"no keepalive: never relayed (no direct try would follow)", []pathPeer{noKeepalive(peer(a, old, time.Time{})), hub(h1, fresh)}, nil, false},
		{"a hub is never relayed", []pathPeer{hub(h1, fresh), hub(h2, stale)}, nil, false},
		{"two live hubs: the pair's hub", []pathPeer{peer(a, old, time.Time{}), hub(h1, fresh), hub(h2, fresh)}, map[wgtypes.Key]wgtypes.Key{a: one}, true},
		{"two hubs, one live: the live one", []pathPeer{peer(a, old, time.Time{}), hub(h1, stale), hub(h2, fresh)}, map[wgtypes.Key]wgtypes.Key{a: h2}, true},
		{"one relayed, one direct", []pathPeer{peer(a, old, time.Time{}), peer(b, old, fresh), hub(h1, fresh)}, map[wgtypes.Key]wgtypes.Key{a: h1}, true},
	} {
		relay, pending := choosePaths(self, c.peers, now)
		if len(relay) != len(c.relay) || pending != c.pending {
			t.Errorf("%s: relay %v pending %v, want %v %v", c.name, relay, pending, c.relay, c.pending)
			continue
		}
		for k, h := range c.relay {
			if relay[k] != h {
				t.Errorf("%s: peer %x through %x, want %x", c.name, k[0], relay[k][0], h[0])
			}
		}
	}
}

// Both ends of a pair pick the same hub, and pairs spread over the hubs.
func TestPickHubAgrees(t *testing.T) {
	hubs := []wgtypes.Key{mustGen(t).PublicKey(), mustGen(t).PublicKey(), mustGen(t).PublicKey()}
	used := map[wgtypes.Key]int{}
	for range 60 {
		a, b := mustGen(t).PublicKey(), mustGen(t).PublicKey()
		h := pickHub(a, b, hubs)
		if h != pickHub(b, a, hubs) {
			t.Fatalf("pair %s %s: the two ends pick different hubs", a, b)
		}
		used[h]++
	}
	if len(used) != len(hubs) {
		t.Errorf("60 pairs used %d of %d hubs: %v", len(used), len(hubs), used)
	}
}

func mustGen(t *testing.T) wgtypes.Key {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// placeSubnets moves a relayed peer's subnets to its hub's entry, leaving
// the peer's entry (endpoint, keepalive) with none, and the caller's map
// as it was.
func TestPlaceSubnets(t *testing.T) {
	now := time.Now()
	self, a, h := mustGen(t), mustGen(t).PublicKey(), mustGen(t).PublicKey()
	_, na, _ := net.ParseCIDR("10.70.2.0/24")
	_, nh, _ := net.ParseCIDR("10.70.9.0/24")
	want := map[wgtypes.Key]Peer{
		a: {PublicKey: a, AllowedIPs: []net.IPNet{*na}, PersistentKeepalive: 25 * time.Second},
		h: {PublicKey: h, AllowedIPs: []net.IPNet{*nh}, PersistentKeepalive: 25 * time.Second, Hub: true},
	}
	// The device has a's subnet on the hub already (relayed before this
	// process started) and a live session with the hub only.
	have := map[wgtypes.Key]wgtypes.Peer{
		a: {PublicKey: a},
		h: {PublicKey: h, AllowedIPs: []net.IPNet{*nh, *na}, LastHandshakeTime: now},
	}
	d := &Device{name: "relaytest"}
	t.Cleanup(func() { forgetPaths(d.name) })
	got := d.placeSubnets(self.PublicKey(), want, have, true, now)
	if len(got[a].AllowedIPs) != 0 || len(got[h].AllowedIPs) != 2 || got[a].PersistentKeepalive != 25*time.Second {
		t.Fatalf("relayed: a %v, hub %v", got[a], got[h])
	}
	if len(want[a].AllowedIPs) != 1 || len(want[h].AllowedIPs) != 1 {
		t.Fatalf("the caller's peers changed: %v", want)
	}
	if pending, watched := d.PathsPending(); !pending || !watched {
		t.Errorf("a relayed peer: pending %v, watched %v", pending, watched)
	}
	// A direct handshake: back on its own entry, nothing pending.
	have[a] = wgtypes.Peer{PublicKey: a, LastHandshakeTime: now}
	got = d.placeSubnets(self.PublicKey(), want, have, true, now)
	pending, watched := d.PathsPending()
	if len(got[a].AllowedIPs) != 1 || len(got[h].AllowedIPs) != 1 || pending || !watched {
		t.Fatalf("direct again: a %v, hub %v, pending %v watched %v", got[a], got[h], pending, watched)
	}
	// No hub any more: nothing to watch.
	delete(want, h)
	d.placeSubnets(self.PublicKey(), want, have, true, now)
	if pending, watched := d.PathsPending(); pending || watched {
		t.Fatalf("no hub: pending %v, watched %v", pending, watched)
	}
}

// FuzzChoosePaths: whatever the peers, their handshakes and ages, a hub
// is never relayed, a peer with a live session or without keepalive never
// is, every relay goes through a hub with a live session, pending holds
// whenever something is relayed, and the other end of each relayed pair,
// seeing the same live hubs, picks the same hub.
func FuzzChoosePaths(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, uint8(3))
	f.Add([]byte{255, 0, 17, 3, 200, 9, 1, 1, 1, 2, 2, 2, 3, 3, 3}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, selfByte uint8) {
		now := time.Unix(1_000_000, 0)
		var self wgtypes.Key
		self[0], self[1] = selfByte, 0xee
		var peers []pathPeer
		seen := map[wgtypes.Key]bool{self: true}
		for i := 0; i+2 < len(data) && len(peers) < 16; i += 3 {
			var k wgtypes.Key
			k[0], k[1] = data[i], byte(i)
			if seen[k] {
				continue
			}
			seen[k] = true
			p := pathPeer{key: k, hub: data[i+1]&1 != 0, keepalive: data[i+1]&2 != 0,
				since: now.Add(-time.Duration(data[i+2]%40) * time.Second)}
			if age := data[i+1] >> 2; age != 0 {
				p.handshake = now.Add(-time.Duration(age) * 5 * time.Second) // 5 s to 5 min 15 s ago
			}
			if data[i+2]&0x80 != 0 && len(peers) > 0 {
				p.via = peers[0].key
			}
			peers = append(peers, p)
		}
		relay, pending := choosePaths(self, peers, now)
		byKey := map[wgtypes.Key]pathPeer{}
		var live []wgtypes.Key
		for _, p := range peers {
			byKey[p.key] = p
			if p.hub && p.live(now) {
				live = append(live, p.key)
			}
		}
		if len(relay) > 0 && !pending {
			t.Fatalf("relayed %v but not pending", relay)
		}
		for k, h := range relay {
			p, hub := byKey[k], byKey[h]
			switch {
			case p.hub, p.live(now), !p.keepalive:
				t.Fatalf("relayed peer %+v (a hub, live or without keepalive)", p)
			case !hub.hub || !hub.live(now):
				t.Fatalf("relayed through %+v, not a live hub", hub)
			case pickHub(k, self, live) != h:
				t.Fatalf("the two ends of %x-%x pick different hubs", self[0], k[0])
			}
		}
	})
}
