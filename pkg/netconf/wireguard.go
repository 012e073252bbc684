package netconf

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/overlay"
	"github.com/village-cni/village/pkg/validate"
	"github.com/village-cni/village/pkg/wireguard"
)

// BackendWireGuard is the backend type that carries pod traffic between
// nodes encrypted, through a WireGuard device.
const BackendWireGuard = string(overlay.ModeWireGuard)

// WireGuard defaults.
const (
	// DefaultWireGuardKeyDir holds each network's private key,
	// <network>.key, when "keyFile" is not set.
	DefaultWireGuardKeyDir = "/var/lib/village/wireguard"
	// DefaultWireGuardKeepalive is "persistentKeepalive" when not set.
	DefaultWireGuardKeepalive = 25 * time.Second
	// MinWireGuardKeyRotation is the shortest "keyRotation": each
	// rotation makes every peer handshake again.
	MinWireGuardKeyRotation = time.Minute
)

// WireGuard is the `backend.wireguard` section (type wireguard only).
type WireGuard struct {
	// Port is the UDP port the device listens on, the same on every
	// node (0: overlay.DefaultWireGuardPort, 51820).
	Port int `json:"port,omitempty"`
	// KeyFile holds the node's private key, made on first start (0600, in a
	// 0700 directory) and kept across restarts; "" means
	// DefaultWireGuardKeyDir/<network>.key.
	KeyFile string `json:"keyFile,omitempty"`
	// PersistentKeepalive: how often an idle tunnel sends a keepalive, a
	// duration ("25s") or whole seconds (25); 0 sends none. Unset:
	// DefaultWireGuardKeepalive.
	PersistentKeepalive *Seconds `json:"persistentKeepalive,omitempty"`
	// Userspace is auto (the kernel's WireGuard when it has it,
	// wireguard-go otherwise), never or always.
	Userspace string `json:"userspace,omitempty"`
	// KeyRotation: how old the node's key may get before the agent
	// changes it (as `villaged rotate-key` does), a duration ("720h") or
	// whole seconds; unset or 0: never on its own. At least
	// MinWireGuardKeyRotation.
	KeyRotation *Seconds `json:"keyRotation,omitempty"`
	// Endpoint is the address:port this node asks its peers to send to
	// (behind NAT, or another address than the underlay's); "": its
	// underlay address at Port.
	Endpoint string `json:"endpoint,omitempty"`
	// Hubs names the nodes that relay between peers that cannot reach
	// each other (each behind its own NAT), besides those a kubernetes
	// registry finds labelled village.cni.io/wireguard-hub: "true": the
	// way to name them with the etcd registry.
	Hubs []string `json:"hubs,omitempty"`

	// Parsed.
	EndpointAddr *net.UDPAddr `json:"-"`
}

// Seconds is a duration written as a Go duration string ("25s") or a
// number of whole seconds (25).
type Seconds time.Duration

// UnmarshalJSON takes "25s" or 25.
func (s *Seconds) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		d, err := time.ParseDuration(str)
		if err != nil {
			return err
		}
		*s = Seconds(d)
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a duration like \"25s\" or a number of seconds, got %s", b)
	}
	*s = Seconds(time.Duration(n * float64(time.Second)))
	return nil
}

// MarshalJSON writes the duration string.
func (s Seconds) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(s).String()) }

// parseWireGuard fills the defaults of the wireguard section and checks
// it, and that the rest of the backend suits it: peers come from a registry
// (where their public keys are published), not from static nodes.
func (b *Backend) parseWireGuard() *types.Error {
	if b.Type != BackendWireGuard {
		if b.WireGuard != nil {
			return Error("invalid \"backend.wireguard\": only for backend type %q, not %q", BackendWireGuard, b.Type)
		}
		return nil
	}
	switch {
	case b.Registry == nil:
		return Error("invalid \"backend\": type wireguard needs a \"registry\": each node publishes its WireGuard public key there")
	case len(b.Nodes) > 0:
		return Error("invalid \"backend.nodes\": type wireguard takes its peers from the registry, where their public keys are (static nodes have none)")
	case b.Port != 0:
		return Error("invalid \"backend.port\": the WireGuard port is \"backend.wireguard.port\"")
	case b.VNI != 0:
		return Error("invalid \"backend.vni\": type wireguard has no VNI")
	}
	if b.WireGuard == nil {
		b.WireGuard = &WireGuard{}
	}
	w := b.WireGuard
	if w.Port == 0 {
		w.Port = overlay.DefaultWireGuardPort
	}
	if w.Port < 1 || w.Port > 65535 {
		return Error("invalid \"backend.wireguard.port\" %d: 1-65535", w.Port)
	}
	if w.KeyFile != "" && (!filepath.IsAbs(w.KeyFile) || filepath.Clean(w.KeyFile) != w.KeyFile || w.KeyFile == "/") {
		return Error("invalid \"backend.wireguard.keyFile\" %q: an absolute, clean file path", w.KeyFile)
	}
	if w.PersistentKeepalive == nil {
		ka := Seconds(DefaultWireGuardKeepalive)
		w.PersistentKeepalive = &ka
	}
	if ka := time.Duration(*w.PersistentKeepalive); ka < 0 || ka > 65535*time.Second || ka%time.Second != 0 {
		return Error("invalid \"backend.wireguard.persistentKeepalive\" %v: whole seconds, 0 (none) to 65535", ka)
	}
	if kr := w.Rotation(); kr != 0 && kr < MinWireGuardKeyRotation {
		return Error("invalid \"backend.wireguard.keyRotation\" %v: 0 (never) or at least %v", kr, MinWireGuardKeyRotation)
	}
	if w.Userspace == "" {
		w.Userspace = wireguard.UserspaceAuto
	}
	switch w.Userspace {
	case wireguard.UserspaceAuto, wireguard.UserspaceNever, wireguard.UserspaceAlways:
	default:
		return Error("invalid \"backend.wireguard.userspace\" %q: auto, never or always", w.Userspace)
	}
	for _, h := range w.Hubs {
		if err := validate.NodeName(h); err != nil {
			return Error("invalid \"backend.wireguard.hubs\": %v", err)
		}
	}
	if w.Endpoint != "" {
		host, port, err := net.SplitHostPort(w.Endpoint)
		ip := net.ParseIP(host)
		p, perr := strconv.Atoi(port)
		if err != nil || ip == nil || perr != nil || p < 1 || p > 65535 {
			return Error("invalid \"backend.wireguard.endpoint\" %q: an IP address and port, like 203.0.113.7:51820 or [2001:db8::7]:51820", w.Endpoint)
		}
		if ip4 := ip.To4(); ip4 != nil {
			ip = ip4
		}
		w.EndpointAddr = &net.UDPAddr{IP: ip, Port: p}
	}
	return nil
}

// Rotation is "keyRotation" (0: never).
func (w *WireGuard) Rotation() time.Duration {
	if w.KeyRotation == nil {
		return 0
	}
	return time.Duration(*w.KeyRotation)
}

// KeyPath is the private key file of network: "keyFile", else
// DefaultWireGuardKeyDir/<network>.key.
func (w *WireGuard) KeyPath(network string) string {
	if w.KeyFile != "" {
		return w.KeyFile
	}
	return filepath.Join(DefaultWireGuardKeyDir, network+".key")
}

// overlayConfig is the WireGuard part of the reconciler configuration.
func (w *WireGuard) overlayConfig(network string) overlay.WireGuardConfig {
	return overlay.WireGuardConfig{
		KeyFile:             w.KeyPath(network),
		PersistentKeepalive: time.Duration(*w.PersistentKeepalive),
		Userspace:           w.Userspace,
		Hubs:                w.Hubs,
	}
}
