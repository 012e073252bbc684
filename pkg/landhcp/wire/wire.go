// Package wire is the protocol between the village plugin and villaged's
// DHCP lease manager (pkg/landhcp): one JSON request per connection on a
// unix socket only root can open, one JSON answer, then the server closes.
// The plugin links only this package (the standard library, no DHCP code,
// no Kubernetes client); the DHCP exchanges run in the agent, which
// outlives the plugin's process and so can renew the lease while the pod
// lives.
package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
)

// SocketName is the socket's file name in villaged's run directory.
const SocketName = nodelocal.DHCPSocketName

// SocketPath is the socket the plugin calls: path when the config names
// one, else dhcp.sock in the run directory (nodelocal.DHCPSocket).
func SocketPath(path string) string {
	if path != "" {
		return path
	}
	return nodelocal.DHCPSocket("")
}

// Ops of a Request.
const (
	OpAcquire = "acquire" // DISCOVER..ACK from inside the pod, then renew while it lives
	OpRelease = "release" // DHCPRELEASE and forget the lease (DEL)
	OpCheck   = "check"   // the lease is held and not expired (CHECK)
	OpStatus  = "status"  // the manager answers (STATUS)
	OpGC      = "gc"      // release every lease whose attachment is not in Valid (GC)
)

// Attachment names one pod interface: the CNI container ID and the LAN
// interface's name.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// Request is what the plugin asks.
type Request struct {
	Op string `json:"op"`
	// Network is the network's name: GC releases only its leases.
	Network string `json:"network,omitempty"`
	Attachment
	// Netns is the pod's network namespace path, where the DHCP client's
	// socket is opened on IfName.
	Netns string `json:"netns,omitempty"`
	// MAC is the interface's hardware address, the one the LAN's server
	// knows the pod by (its reservations are by MAC).
	MAC string `json:"mac,omitempty"`
	// ClientID is option 61 in hex; empty means 01 followed by the MAC
	// (hardware type Ethernet), so the identity moves with the MAC.
	ClientID string `json:"clientID,omitempty"`
	// Hostname is option 12, the name the LAN's router shows for the pod.
	Hostname string `json:"hostname,omitempty"`
	// Valid lists the attachments that live, for OpGC.
	Valid []Attachment `json:"valid,omitempty"`
}

// Lease is a held lease as the plugin puts it in the CNI result.
type Lease struct {
	Address string    `json:"address"`           // CIDR: the leased address with the server's subnet mask
	Gateway string    `json:"gateway,omitempty"` // option 3 (informational: the default route stays on eth0)
	DNS     []string  `json:"dns,omitempty"`     // option 6
	Domain  string    `json:"domain,omitempty"`  // option 15
	Server  string    `json:"server"`            // option 54
	Renew   time.Time `json:"renew"`             // T1
	Rebind  time.Time `json:"rebind"`            // T2
	Expires time.Time `json:"expires"`
}

// Response is the manager's answer: Error, or the lease (OpAcquire,
// OpCheck) and the number of leases released (OpGC).
type Response struct {
	Error    string `json:"error,omitempty"`
	Lease    *Lease `json:"lease,omitempty"`
	Released int    `json:"released,omitempty"`
}

// ErrNoAgent says the socket is not there or nobody listens: villaged is
// not running on this node.
var ErrNoAgent = errors.New("villaged's DHCP lease manager is not answering")

// Call sends req to the manager at socket and returns its answer; a
// manager error comes back as an error naming the op.
func Call(ctx context.Context, socket string, req Request) (*Response, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w on %s (is villaged running on this node?): %w", ErrNoAgent, socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return nil, fmt.Errorf("DHCP %s: sending to %s: %w", req.Op, socket, err)
	}
	var resp Response
	if err := json.NewDecoder(io.LimitReader(conn, MaxMessage)).Decode(&resp); err != nil {
		return nil, fmt.Errorf("DHCP %s: reading the answer from %s: %w", req.Op, socket, err)
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("DHCP %s of %s/%s: %s", req.Op, req.ContainerID, req.IfName, resp.Error)
	}
	return &resp, nil
}

// MaxMessage bounds a request or an answer (a GC list of many
// attachments fits).
const MaxMessage = 4 << 20

// ReadRequest decodes one request from r (bounded by MaxMessage).
func ReadRequest(r io.Reader) (Request, error) {
	var req Request
	dec := json.NewDecoder(io.LimitReader(r, MaxMessage))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("bad request: %w", err)
	}
	return req, nil
}
