package wireguard

import (
	"bytes"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Who speaks first when two nodes learn of each other at once.
//
// A device given a peer with a persistent keepalive sends a keepalive at
// once, and with no session yet that is a handshake initiation. Two nodes
// that add each other within the same moment (a node joins, and it and
// the others each learn of the other from the registry) so send two
// initiations that cross. Each side then both answers the other's
// initiation and consumes the answer to its own, and when the two are
// handled concurrently (wireguard-go hands handshakes to parallel workers)
// one overwrites the other's handshake state: both sessions are lost, and
// WireGuard tries again only after REKEY_TIMEOUT, 5 s, during which the
// pods of the two nodes cannot reach each other.
//
// So of two peers only the one with the lower public key speaks first: the
// other adds the new peer without its keepalive, answers the initiation
// that comes, and turns the keepalive on quietFor later. Then it sends a
// keepalive on the session made meanwhile, or, when no initiation came
// (the lower key's node has not learnt of this one yet, or cannot reach
// it: this node is behind NAT), it initiates itself, long after the other
// side's attempt and well before that side's retry. The price: a node
// restarted with a new device, whose key is the higher, is reached by such
// a peer only when it initiates, quietFor after it learnt of the peer (the
// peer's packets meanwhile go to the old device's session).
var quietFor = 500 * time.Millisecond // a variable for the tests only

// quietPeer is a peer added without its keepalive until the time.
type quietPeer struct {
	until     time.Time
	keepalive time.Duration
}

// quiet holds, by device name, the peers added quietly whose keepalive is
// not on yet; quietMu guards it.
var (
	quietMu sync.Mutex
	quiet   = map[string]map[wgtypes.Key]quietPeer{}
)

// speaksFirst tells whether a node with public key self initiates to a new
// peer as soon as it learns of it.
func speaksFirst(self, peer wgtypes.Key) bool {
	return bytes.Compare(self[:], peer[:]) < 0
}

// quietKeepalive is the keepalive to write for wanted peer p now, and
// whether p is a new peer to keep quiet: 0 while p stays quiet on device
// name (new in this write, or added within quietFor), p's own otherwise.
// isNew tells whether the device lacks p; record, whether this write
// happens. A new peer's quiet time is started by keepQuiet once the write
// that adds it is done, never before: speakUp must not come first and
// find no peer to turn the keepalive on for, leaving it off for good.
func quietKeepalive(name string, self wgtypes.Key, p Peer, isNew, record bool, now time.Time) (time.Duration, bool) {
	if p.PersistentKeepalive <= 0 || quietFor <= 0 || speaksFirst(self, p.PublicKey) {
		return p.PersistentKeepalive, false
	}
	if isNew {
		return 0, true
	}
	quietMu.Lock()
	defer quietMu.Unlock()
	q, ok := quiet[name][p.PublicKey]
	switch {
	case ok && now.Before(q.until):
		if record {
			quiet[name][p.PublicKey] = quietPeer{until: q.until, keepalive: p.PersistentKeepalive}
		}
		return 0, false
	case ok && record:
		delete(quiet[name], p.PublicKey)
	}
	return p.PersistentKeepalive, false
}

// keepQuiet starts the quiet time of peers, just added to device name
// without their keepalive, at now: speakUp turns it on quietFor later.
func keepQuiet(name string, peers []Peer, now time.Time) {
	if len(peers) == 0 {
		return
	}
	quietMu.Lock()
	defer quietMu.Unlock()
	if quiet[name] == nil {
		// One timer a device: speakUp arms the next one while quiet
		// peers remain.
		quiet[name] = map[wgtypes.Key]quietPeer{}
		time.AfterFunc(quietFor, func() { speakUp(name) })
	}
	for _, p := range peers {
		quiet[name][p.PublicKey] = quietPeer{until: now.Add(quietFor), keepalive: p.PersistentKeepalive}
	}
}

// speakUp turns on the keepalive of device name's peers whose quiet time
// is over, for those still on the device (UpdateOnly: a peer removed
// meanwhile is not brought back), and arms itself again for the first of
// those still quiet.
func speakUp(name string) {
	now := time.Now()
	var due []wgtypes.PeerConfig
	var next time.Time
	quietMu.Lock()
	for k, q := range quiet[name] {
		switch {
		case !now.Before(q.until):
			ka := q.keepalive
			due = append(due, wgtypes.PeerConfig{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &ka})
			delete(quiet[name], k)
		case next.IsZero() || q.until.Before(next):
			next = q.until
		}
	}
	if len(quiet[name]) == 0 {
		delete(quiet, name)
	} else {
		time.AfterFunc(next.Sub(now), func() { speakUp(name) })
	}
	quietMu.Unlock()
	if len(due) == 0 {
		return
	}
	d, err := Open(name)
	if err != nil {
		return // the device is gone: nothing to speak on
	}
	defer d.client.Close()
	_ = d.client.ConfigureDevice(name, wgtypes.Config{Peers: due})
}

// forgetQuiet drops device name's quiet peers (the device closed).
func forgetQuiet(name string) {
	quietMu.Lock()
	delete(quiet, name)
	quietMu.Unlock()
}
