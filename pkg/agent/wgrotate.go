package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/registry"
)

// WireGuard key rotation: `villaged rotate-key` asks, the "keyRotation"
// period asks on its own, the agent rotates (overlay's
// RotateWireGuardKey: the device first, then the key file) and publishes
// the new public key. Each file has one writer: the request
// (nodelocal.WireGuardRotate) is the command's, the status
// (nodelocal.WireGuardKey) the agent's.

// RotateRequest is what `villaged rotate-key` writes: a new ID asks for
// one rotation.
type RotateRequest struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
}

// KeyStatus is the agent's WireGuard key as it last published it.
type KeyStatus struct {
	PublicKey string `json:"publicKey"`
	// Since is when this key was made (the key file's modification time).
	Since time.Time `json:"since"`
	// Served is the ID of the last request the agent answered, Error its
	// failure ("" when the rotation happened).
	Served string `json:"served,omitempty"`
	Error  string `json:"error,omitempty"`
}

// rotator is the agent's side of key rotation; nil for the other backends.
type rotator struct {
	c       *Conf
	runDir  string
	period  time.Duration // "keyRotation"; 0: only on request
	status  KeyStatus
	request chan string // IDs of new requests, the latest only
}

// newRotator writes the status of the key loaded at start and starts
// following the request file until ctx is done; nil unless the backend is
// wireguard.
func (a *agent) newRotator(ctx context.Context) (*rotator, error) {
	c := a.c
	w := c.Backend.WireGuard
	if c.Backend.Type != netconf.BackendWireGuard || w == nil {
		return nil, nil
	}
	rt := &rotator{c: c, runDir: a.opts.RunDir, period: w.Rotation(), request: make(chan string, 1)}
	var prev KeyStatus
	if _, err := nodelocal.ReadJSON(nodelocal.WireGuardKey(rt.runDir, c.Net.Name), &prev); err != nil {
		a.opts.logf("wireguard key status: %v (written anew)", err)
	}
	rt.status = KeyStatus{PublicKey: c.wg.key, Since: rt.keyTime(), Served: prev.Served}
	if err := rt.write(); err != nil { // makes the directory watched
		return nil, err
	}
	changed, err := watchFile(ctx, nodelocal.WireGuardRotate(rt.runDir, c.Net.Name), a.opts.logf)
	if err != nil {
		return nil, err
	}
	go rt.follow(ctx, changed, a.opts.logf)
	return rt, nil
}

// keyTime is when the key file was last written (now when unreadable).
func (rt *rotator) keyTime() time.Time {
	fi, err := os.Stat(rt.c.Backend.WireGuard.KeyPath(rt.c.Net.Name))
	if err != nil {
		return time.Now()
	}
	return fi.ModTime()
}

func (rt *rotator) write() error {
	b, err := json.Marshal(rt.status)
	if err != nil {
		return err
	}
	return nodelocal.WriteFile(nodelocal.WireGuardKey(rt.runDir, rt.c.Net.Name), append(b, '\n'), 0o644)
}

// follow sends the ID of each request the status has not served: it
// reads the request file at start and each time changed says it was
// written, so an agent nobody asks does nothing.
func (rt *rotator) follow(ctx context.Context, changed <-chan struct{}, logf func(string, ...any)) {
	path := nodelocal.WireGuardRotate(rt.runDir, rt.c.Net.Name)
	seen := rt.status.Served
	for {
		var req RotateRequest
		if _, err := nodelocal.ReadJSON(path, &req); err != nil {
			logf("wireguard key rotation request: %v", err)
		} else if req.ID != "" && req.ID != seen {
			seen = req.ID
			latest(rt.request, req.ID)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// due tells whether "keyRotation" asks for a new key now.
func (rt *rotator) due(now time.Time) bool {
	return rt.period > 0 && !now.Before(rt.status.Since.Add(rt.period))
}

// rotateKey gives the node a new WireGuard key and registers it (id: the
// request served, "" for the period's).
func (a *agent) rotateKey(why, id string, records chan registry.Node) {
	rt := a.rot
	pub, err := a.r.RotateWireGuardKey()
	rt.status.Served, rt.status.Error = id, ""
	if err != nil {
		rt.status.Error = err.Error()
		a.opts.logf("rotating the WireGuard key (%s): %v (the old key stays)", why, err)
	} else {
		old := a.c.wg.key
		a.c.wg.key = pub.String()
		rt.status.PublicKey, rt.status.Since = pub.String(), time.Now()
		a.opts.logf("WireGuard key rotated (%s): %s -> %s; publishing it, peers take it over from the registry", why, old, pub)
		if records != nil {
			latest(records, record(a.self.Name, a.self.IP, a.self.PodCIDRs, a.c.wg))
		}
	}
	if err := rt.write(); err != nil {
		a.opts.logf("wireguard key status: %v", err)
	}
}

// RotateKey asks the agent of opts' network on this node for a new
// WireGuard key and waits, until ctx is done, for it to say it made and
// published one; it returns the old and the new public key.
func RotateKey(ctx context.Context, opts Options) (old, new string, err error) {
	c, err := Load(opts)
	if err != nil {
		return "", "", err
	}
	if c.Backend.Type != netconf.BackendWireGuard {
		return "", "", fmt.Errorf("network %q: backend %q has no WireGuard key", c.Net.Name, c.Backend.Type)
	}
	statusPath := nodelocal.WireGuardKey(opts.RunDir, c.Net.Name)
	var before KeyStatus
	found, err := nodelocal.ReadJSON(statusPath, &before)
	if err != nil {
		return "", "", err
	}
	if !found {
		return "", "", fmt.Errorf("network %q: no %s: is villaged run running on this node?", c.Net.Name, statusPath)
	}
	// Watch the status before asking, so that no answer is missed.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	changed, err := watchFile(wctx, statusPath, func(string, ...any) {})
	if err != nil {
		return "", "", err
	}
	idb := make([]byte, 8)
	_, _ = rand.Read(idb)
	req := RotateRequest{ID: hex.EncodeToString(idb), At: time.Now().UTC()}
	b, _ := json.Marshal(req)
	if err := nodelocal.WriteFile(nodelocal.WireGuardRotate(opts.RunDir, c.Net.Name), append(b, '\n'), 0o600); err != nil {
		return "", "", err
	}
	for {
		var st KeyStatus
		if _, err := nodelocal.ReadJSON(statusPath, &st); err != nil {
			return "", "", err
		}
		if st.Served == req.ID {
			if st.Error != "" {
				return "", "", fmt.Errorf("network %q: the agent could not rotate the WireGuard key: %s", c.Net.Name, st.Error)
			}
			return before.PublicKey, st.PublicKey, nil
		}
		select {
		case <-ctx.Done():
			return "", "", fmt.Errorf("network %q: the agent did not rotate the WireGuard key (request %s in %s): %w",
				c.Net.Name, req.ID, nodelocal.WireGuardRotate(opts.RunDir, c.Net.Name), errors.Join(ctx.Err(), errors.New("is villaged run running?")))
		case <-changed:
		}
	}
}
