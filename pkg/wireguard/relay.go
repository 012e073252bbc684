package wireguard

import (
	"bytes"
	"crypto/sha256"
	"slices"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Relaying through hubs.
//
// Two nodes each behind its own NAT cannot reach each other: each one's
// handshakes go to the other's published address, which its NAT does not
// forward. Both can reach a hub (a peer with [Peer.Hub], a node with a
// public address), so [Device.SetPeers] puts such a peer's pod subnets on
// a hub's entry (its allowed IPs) instead of the peer's own: the device
// then encrypts that traffic to the hub, the hub decrypts it, routes it
// (its route to the peer's pod subnet goes through its own device) and
// encrypts it again to the peer, which, deciding the same, expects it on
// its entry of the same hub. The peer's own entry stays, endpoint and
// keepalive, with no allowed IPs: WireGuard keeps trying to handshake
// with it directly (a persistent keepalive starts a new round of tries
// after each round of 5 s retries gives up, in the kernel's device and
// wireguard-go's alike), and once a direct handshake completes the
// subnets move back. choosePaths decides, from the device's handshake
// times only.
//
// Moving a subnet between entries changes no route: every pod subnet of
// a peer is routed into the device whichever entry carries it, so a
// packet never leaves in the clear; at worst, while an entry has no
// session yet, it waits in WireGuard's queue or is dropped. The change is
// written with the entry that gains a subnet before the one that loses
// it, so the subnet always has an entry.
//
// The hub sees the relayed traffic decrypted: relaying trusts it as much
// as a node that routes pod traffic can be trusted.

// RelayGrace is how long a peer with no handshake yet is given to
// complete one directly before its pod subnets go through a hub: three of
// WireGuard's handshake tries (REKEY_TIMEOUT, 5 s apart), so one lost
// initiation, or a peer that learns of this node a little later, does not
// send a reachable peer's traffic the long way round.
const RelayGrace = 15 * time.Second

// pathPeer is one wanted peer as choosePaths sees it.
type pathPeer struct {
	key wgtypes.Key
	hub bool
	// keepalive: the peer has a persistent keepalive, so a relayed peer is
	// still tried directly. Without one nothing would try again, and the
	// peer is never relayed.
	keepalive bool
	since     time.Time   // when this process first gave the device this peer
	handshake time.Time   // the device's last handshake with it; zero: none
	via       wgtypes.Key // the hub whose entry carries its subnets now; zero: its own
}

// live tells whether the device has a session with p within RoamFresh:
// the direct path works.
func (p pathPeer) live(now time.Time) bool {
	return !p.handshake.IsZero() && now.Sub(p.handshake) < RoamFresh
}

// choosePaths is the one decision of which entry carries each peer's pod
// subnets, for the device with public key self: relay holds, for each
// peer whose subnets go through a hub, that hub's key; every other peer
// carries its own. A peer is relayed when it has no live session (no
// handshake within RoamFresh), has a keepalive, is no hub itself, some
// hub has a live session, and it is either past RelayGrace since it came
// or already relayed (so an agent restart does not bring a relayed pair
// back to a dead direct path for the grace time). Of the live hubs the
// pair's rendezvous hash picks one (pickHub), the same at both ends when
// both see the same hubs live, and spreading pairs over hubs. A peer with
// a live session always goes direct.
//
// pending tells whether the answer may change with the clock alone, so
// the caller looks again: some non-hub peer has no live session while
// there are hubs (undecided, waiting for a hub, or relayed and still tried
// directly). With no hub, or every peer direct and live, it is false (a
// live direct session that dies is seen at the caller's next, slower,
// look: see PathsPending).
func choosePaths(self wgtypes.Key, peers []pathPeer, now time.Time) (relay map[wgtypes.Key]wgtypes.Key, pending bool) {
	var hubs, live []wgtypes.Key
	for _, p := range peers {
		if p.hub {
			hubs = append(hubs, p.key)
			if p.live(now) {
				live = append(live, p.key)
			}
		}
	}
	if len(hubs) == 0 {
		return nil, false
	}
	for _, p := range peers {
		if p.hub || !p.keepalive || p.live(now) {
			continue
		}
		pending = true
		if len(live) == 0 || (p.via == (wgtypes.Key{}) && now.Sub(p.since) < RelayGrace) {
			continue
		}
		if relay == nil {
			relay = map[wgtypes.Key]wgtypes.Key{}
		}
		relay[p.key] = pickHub(self, p.key, live)
	}
	return relay, pending
}

// pickHub is the hub of hubs with the highest hash of the pair (a, b) in
// either order and the hub's key.
func pickHub(a, b wgtypes.Key, hubs []wgtypes.Key) wgtypes.Key {
	if bytes.Compare(a[:], b[:]) > 0 {
		a, b = b, a
	}
	var best wgtypes.Key
	var bestSum [sha256.Size]byte
	for i, h := range hubs {
		s := sha256.New()
		s.Write(a[:])
		s.Write(b[:])
		s.Write(h[:])
		var sum [sha256.Size]byte
		s.Sum(sum[:0])
		if i == 0 || bytes.Compare(sum[:], bestSum[:]) > 0 {
			best, bestSum = h, sum
		}
	}
	return best
}

// pathState is a device's memory for choosePaths: when each peer was
// first given to it by this process, and whether the last decision was
// pending.
type pathState struct {
	since   map[wgtypes.Key]time.Time
	pending bool
}

// paths holds the pathState of each device by name; pathsMu guards it.
var (
	pathsMu sync.Mutex
	paths   = map[string]*pathState{}
)

// PathsPending tells whether the last SetPeers left a peer whose path may
// change with the clock alone (see choosePaths): the caller then calls
// SetPeers again soon (villaged: every second). watched tells whether the
// last SetPeers had a hub at all: then a direct session that dies is
// relayed at the first SetPeers after it has been dead RoamFresh, so the
// caller calls it now and then even with nothing pending (villaged:
// every 30 s).
func (d *Device) PathsPending() (pending, watched bool) {
	pathsMu.Lock()
	defer pathsMu.Unlock()
	s := paths[d.name]
	return s != nil && s.pending, s != nil
}

// forgetPaths drops device name's path state (the device closed).
func forgetPaths(name string) {
	pathsMu.Lock()
	delete(paths, name)
	pathsMu.Unlock()
}

// placeSubnets is want with the subnets of each peer choosePaths relays
// moved to its hub's entry (want itself is not changed). have is the
// device's peers; write records, for the device, when each peer came and
// whether the decision is pending.
func (d *Device) placeSubnets(self wgtypes.Key, want map[wgtypes.Key]Peer, have map[wgtypes.Key]wgtypes.Peer, write bool, now time.Time) map[wgtypes.Key]Peer {
	hub := false
	for _, p := range want {
		hub = hub || p.Hub
	}
	if !hub {
		if write {
			forgetPaths(d.name) // no hub: every path direct, nothing to remember
		}
		return want
	}
	carrier := map[string]wgtypes.Key{} // the device's entry of each subnet now
	for k, h := range have {
		for _, n := range prefixSet(h.AllowedIPs) {
			carrier[n] = k
		}
	}
	pathsMu.Lock()
	st := paths[d.name]
	if st == nil {
		st = &pathState{since: map[wgtypes.Key]time.Time{}}
		if write {
			paths[d.name] = st
		}
	}
	in := make([]pathPeer, 0, len(want))
	for k, p := range want {
		pp := pathPeer{key: k, hub: p.Hub, keepalive: p.PersistentKeepalive > 0, since: now, handshake: have[k].LastHandshakeTime}
		if t, ok := st.since[k]; ok {
			pp.since = t
		} else if write {
			st.since[k] = now
		}
		if s := prefixSet(p.AllowedIPs); len(s) > 0 {
			if c, ok := carrier[s[0]]; ok && c != k && want[c].Hub {
				pp.via = c
			}
		}
		in = append(in, pp)
	}
	relay, pending := choosePaths(self, in, now)
	if write {
		st.pending = pending
		for k := range st.since {
			if _, ok := want[k]; !ok {
				delete(st.since, k)
			}
		}
	}
	pathsMu.Unlock()
	if len(relay) == 0 {
		return want
	}
	out := make(map[wgtypes.Key]Peer, len(want))
	for k, p := range want {
		out[k] = p
	}
	for k, hub := range relay {
		h, p := out[hub], out[k]
		h.AllowedIPs = append(slices.Clip(h.AllowedIPs), p.AllowedIPs...)
		p.AllowedIPs = nil
		out[hub], out[k] = h, p
	}
	return out
}
