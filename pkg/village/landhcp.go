package village

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/netconf"
)

// dhcpClaim is the LAN interface's address with `macvlan.ipam` of type
// dhcp: a lease villaged's DHCP client (pkg/landhcp) gets from the LAN's
// own server, asked over villaged's root-only socket (pkg/agentsock, op
// "dhcp"). Unlike an IPAM
// plugin's claim it needs the interface first (the DHCP exchange runs on
// it, with its MAC), so addLAN makes the link and then acquires.
type dhcpClaim struct {
	socket  string
	network string
	att     agentsock.Attachment
	// live: a previous ADD of this container made the interface, so a
	// failed ADD leaves its lease alone (see claim.live).
	live bool
}

func newDHCPClaim(conf *netconf.NetConf, args *skel.CmdArgs) *dhcpClaim {
	return &dhcpClaim{socket: agentSocket(conf.LAN), network: conf.Name, att: agentsock.Attachment{ContainerID: args.ContainerID, IfName: conf.LAN.IfName}, live: true}
}

// lanAddresses is the LAN interface's addresses: the IPAM plugin's answer,
// or, with type dhcp, the lease villaged acquires on link.
func (a *adder) lanAddresses(link netlink.Link) (*current.Result, error) {
	if a.dhcp == nil {
		return a.lan.answer()
	}
	return a.dhcp.acquire(a, link)
}

// acquire brings link up and asks villaged for a lease on it, with its
// MAC and the pod's name as host name. Its rollback is pushed first, after
// the link's: a failed ADD releases the lease while net1, which the
// DHCPRELEASE leaves on, still exists.
func (c *dhcpClaim) acquire(a *adder, link netlink.Link) (*current.Result, error) {
	a.undo.Push(fmt.Sprintf("release the DHCP lease of %q", c.att.IfName), c.rollback)
	if err := a.pod.Handle().LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("failed to set %q up for DHCP: %w", c.att.IfName, err)
	}
	// A Kubernetes pod's acquire waits for an agent not answering yet, as
	// its annotated LAN ask does (askAgent): after a reboot the kubelet
	// starts sandboxes before the agent's DaemonSet pod is back. Any other
	// caller (podman, cnitool, beside a villaged it starts itself) is
	// answered at once.
	var bound time.Duration
	if a.conf.Pod.IsSet() {
		var err error
		if bound, err = agentWait(); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound+ipamDeadline)
	defer cancel()
	resp, err := askDHCPWaiting(ctx, c.socket, agentsock.DHCPRequest{Op: agentsock.DHCPAcquire, Network: c.network, Attachment: c.att, Netns: a.args.Netns,
		MAC: link.Attrs().HardwareAddr.String(), Hostname: a.conf.Pod.Name}, bound)
	if err != nil {
		if agentsock.ErrorCode(err) == agentsock.CodeNoAgent {
			return nil, types.NewError(types.ErrTryAgainLater, err.Error(), "")
		}
		return nil, err
	}
	return leaseResult(resp.Lease)
}

// leaseResult is the CNI result of a lease: its address, with the
// router as the address's gateway. No route: the default route stays on
// eth0, and the LAN's DNS servers do not replace the cluster's.
func leaseResult(l *agentsock.Lease) (*current.Result, error) {
	if l == nil {
		return nil, errors.New("villaged answered the DHCP acquire without a lease")
	}
	ip, ipn, err := net.ParseCIDR(l.Address)
	if err != nil {
		return nil, fmt.Errorf("villaged's DHCP lease address %q: %w", l.Address, err)
	}
	ipc := &current.IPConfig{Address: net.IPNet{IP: ip, Mask: ipn.Mask}}
	if l.Gateway != "" {
		ipc.Gateway = net.ParseIP(l.Gateway)
	}
	return &current.Result{IPs: []*current.IPConfig{ipc}}, nil
}

// rollback releases the lease of a failed ADD, unless it belongs to an
// attachment that lives. Nothing held is nothing to release.
func (c *dhcpClaim) rollback() error {
	if c.live {
		return nil
	}
	ctx, cancel := ipamTimeout()
	defer cancel()
	_, err := askDHCP(ctx, c.socket, agentsock.DHCPRequest{Op: agentsock.DHCPRelease, Attachment: c.att})
	if agentsock.ErrorCode(err) == agentsock.CodeNoAgent {
		return nil // nothing can hold a lease the agent is not there to renew
	}
	return err
}

// markLive is checkLive for the DHCP claim.
func (c *dhcpClaim) markLive(a *adder) error {
	l, err := a.pod.OwnedLink(c.att.IfName, a.args.ContainerID, "")
	if err != nil {
		return err
	}
	c.live = l != nil
	return nil
}

// dhcpVerb runs DEL, CHECK, STATUS or GC of a LAN interface whose
// addresses come from villaged's DHCP client. DEL with villaged down
// succeeds: nothing renews the lease, so it lapses on the server (a DEL
// that failed would have the runtime retry it forever).
func (c ipamCall) dhcpVerb(ctx context.Context, verb string) error {
	req := agentsock.DHCPRequest{Network: c.Network, Attachment: agentsock.Attachment{ContainerID: c.Args.ContainerID, IfName: c.IfName}}
	switch verb {
	case "DEL":
		req.Op = agentsock.DHCPRelease
	case "CHECK":
		req.Op = agentsock.DHCPCheck
	case "STATUS":
		req.Op = agentsock.DHCPStatus
	case "GC":
		req.Op = agentsock.DHCPGC
		valid, err := gcValid(c.Conf)
		if err != nil {
			return err
		}
		req.Valid, req.Attachment = valid, agentsock.Attachment{}
	default:
		return fmt.Errorf("DHCP: no verb %s", verb)
	}
	_, err := askDHCP(ctx, c.DHCPSocket, req)
	noAgent := agentsock.ErrorCode(err) == agentsock.CodeNoAgent
	switch {
	case err == nil:
		return nil
	case noAgent && verb == "DEL":
		fmt.Fprintf(os.Stderr, "village: %v: the DHCP lease of %s/%s lapses on the server\n", err, req.ContainerID, req.IfName)
		return nil
	case noAgent:
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return err
}

// gcValid reads the runtime's list of live attachments (withIPAM named
// them by the LAN interface).
func gcValid(stdin []byte) ([]agentsock.Attachment, error) {
	var conf struct {
		Valid []types.GCAttachment `json:"cni.dev/valid-attachments"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, fmt.Errorf("GC: reading cni.dev/valid-attachments: %w", err)
	}
	valid := []agentsock.Attachment{}
	for _, a := range conf.Valid {
		valid = append(valid, agentsock.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	return valid, nil
}

// releaseDHCP runs DEL of the DHCP calls among calls and returns the
// others, with the DHCP calls' errors.
func releaseDHCP(ctx context.Context, calls []ipamCall) (rest []ipamCall, errs []error) {
	for _, c := range calls {
		if c.DHCPSocket == "" {
			rest = append(rest, c)
			continue
		}
		if err := c.Del(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return rest, errs
}

// askDHCP sends req to the agent's DHCP lease manager on the agent socket
// at socket; a refusal or an absent agent is an *agentsock.Error (its Code
// says which).
func askDHCP(ctx context.Context, socket string, req agentsock.DHCPRequest) (*agentsock.DHCPResponse, error) {
	return askDHCPWaiting(ctx, socket, req, 0)
}

// askDHCPWaiting is askDHCP asking again while no agent answers on socket,
// within bound (agentsock.AskWaiting); a bound of 0 asks once.
func askDHCPWaiting(ctx context.Context, socket string, req agentsock.DHCPRequest, bound time.Duration) (*agentsock.DHCPResponse, error) {
	ask := agentsock.Request{Op: agentsock.OpDHCP, Network: req.Network, DHCP: &req}
	var resp *agentsock.Response
	var err error
	if bound > 0 {
		resp, err = agentsock.AskWaiting(ctx, socket, ask, bound)
	} else {
		resp, err = agentsock.Ask(ctx, socket, ask)
	}
	if err != nil {
		return nil, fmt.Errorf("DHCP %s of %s/%s: %w", req.Op, req.ContainerID, req.IfName, err)
	}
	if resp.DHCP == nil {
		return &agentsock.DHCPResponse{}, nil
	}
	return resp.DHCP, nil
}
