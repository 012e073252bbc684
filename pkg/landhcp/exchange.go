package landhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// identity is who the pod is to the DHCP server, sent in every message of
// its leases so the server keeps one binding for it.
type identity struct {
	Netns    string
	IfName   string
	MAC      net.HardwareAddr
	ClientID []byte
	Hostname string
}

// errPodGone: the pod's namespace or its LAN interface no longer exists,
// so its lease can neither be used nor renewed (it lapses on the server).
var errPodGone = errors.New("the pod's namespace or LAN interface is gone")

// firstTimeout is the first wait for an answer; nclient4 doubles it on each
// resend until the exchange's context ends.
const firstTimeout = time.Second

func (id identity) modifiers() []dhcpv4.Modifier {
	mods := []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClientIdentifier(id.ClientID)),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer,
			dhcpv4.OptionDomainName, dhcpv4.OptionIPAddressLeaseTime, dhcpv4.OptionRenewTimeValue, dhcpv4.OptionRebindingTimeValue),
	}
	if id.Hostname != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptHostName(id.Hostname)))
	}
	return mods
}

// client opens a DHCP client on the pod's LAN interface, inside the pod's
// namespace: its packet socket belongs to that namespace for its life. The
// interface must carry id.MAC, the address the server answers to. src is
// the source address of the client's packets and the only destination it
// reads: nil before the pod has an address (DISCOVER), the leased address
// after (a REQUEST from 0.0.0.0 to the server's own address is a martian
// the server's kernel drops).
func (id identity) client(src net.IP, opts ...nclient4.ClientOpt) (*nclient4.Client, error) {
	if _, err := os.Stat(id.Netns); err != nil {
		return nil, fmt.Errorf("%w: netns %s: %w", errPodGone, id.Netns, err)
	}
	var c *nclient4.Client
	err := ns.WithNetNSPath(id.Netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName(id.IfName)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return fmt.Errorf("%w: interface %q", errPodGone, id.IfName)
			}
			return fmt.Errorf("interface %q: %w", id.IfName, err)
		}
		if got := l.Attrs().HardwareAddr; got.String() != id.MAC.String() {
			return fmt.Errorf("interface %q has MAC %s, not the lease's %s", id.IfName, got, id.MAC)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("setting %q up: %w", id.IfName, err)
			}
		}
		raw, err := packet.Listen(&net.Interface{Index: l.Attrs().Index, Name: id.IfName, HardwareAddr: id.MAC},
			packet.Datagram, unix.ETH_P_IP, nil)
		if err != nil {
			return fmt.Errorf("packet socket on %q: %w", id.IfName, err)
		}
		conn := nclient4.NewBroadcastUDPConn(raw, &net.UDPAddr{IP: src, Port: nclient4.ClientPort})
		c, err = nclient4.NewWithConn(conn, id.MAC, append([]nclient4.ClientOpt{
			nclient4.WithTimeout(firstTimeout), nclient4.WithRetry(-1),
		}, opts...)...)
		if err != nil {
			raw.Close()
		}
		return err
	})
	if err != nil {
		var nsErr ns.NSPathNotExistErr
		if errors.As(err, &nsErr) {
			return nil, fmt.Errorf("%w: %w", errPodGone, err)
		}
		return nil, fmt.Errorf("DHCP client on %q in %s: %w", id.IfName, id.Netns, err)
	}
	return c, nil
}

// discover is the INIT state's exchange, asking for want (the previous
// address) when it is set.
func (id identity) discover(ctx context.Context, want net.IP) (*nclient4.Lease, error) {
	c, err := id.client(nil)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mods := id.modifiers()
	if want != nil {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(want)))
	}
	l, err := c.Request(ctx, mods...)
	if err != nil {
		return nil, fmt.Errorf("DISCOVER/REQUEST: %w", err)
	}
	return l, nil
}

// extend is RENEWING's REQUEST, sent to the server that granted the lease
// (unicast: true), or REBINDING's, broadcast to any server.
func (id identity) extend(ctx context.Context, l *nclient4.Lease, unicast bool) (*nclient4.Lease, error) {
	var opts []nclient4.ClientOpt
	if unicast {
		opts = append(opts, nclient4.WithServerAddr(&net.UDPAddr{IP: l.ACK.ServerIdentifier(), Port: nclient4.ServerPort}))
	}
	c, err := id.client(l.ACK.YourIPAddr, opts...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	next, err := c.Renew(ctx, l, id.modifiers()...)
	if err != nil {
		return nil, err
	}
	// Renew keeps the first offer; a rebinding's answer may come from
	// another server, whose identifier the lease then carries.
	next.Offer = next.ACK
	return next, nil
}

// release sends DHCPRELEASE to the server that granted the lease.
func (id identity) release(l *nclient4.Lease) error {
	c, err := id.client(l.ACK.YourIPAddr)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Release(l, dhcpv4.WithOption(dhcpv4.OptClientIdentifier(id.ClientID)))
}

// leaseAddr is the leased address with the server's subnet mask (a /32
// when the server sends none).
func leaseAddr(ack *dhcpv4.DHCPv4) *net.IPNet {
	mask := ack.SubnetMask()
	if mask == nil {
		mask = net.CIDRMask(32, 32)
	}
	return &net.IPNet{IP: ack.YourIPAddr.To4(), Mask: mask}
}

// setAddress replaces old with new on the pod's LAN interface (either may
// be nil): an expired lease's address comes off, a new one goes on.
func (id identity) setAddress(old, new *net.IPNet) error {
	return ns.WithNetNSPath(id.Netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName(id.IfName)
		if err != nil {
			return fmt.Errorf("%w: interface %q: %w", errPodGone, id.IfName, err)
		}
		if old != nil {
			if err := netlink.AddrDel(l, &netlink.Addr{IPNet: old}); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
				return fmt.Errorf("removing %s from %q: %w", old, id.IfName, err)
			}
		}
		if new != nil {
			if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: new}); err != nil {
				return fmt.Errorf("adding %s to %q: %w", new, id.IfName, err)
			}
		}
		return nil
	})
}

// present reports errPodGone when the pod's namespace or its interface no
// longer exists.
func (id identity) present() error {
	if _, err := os.Stat(id.Netns); err != nil {
		return fmt.Errorf("%w: netns %s: %w", errPodGone, id.Netns, err)
	}
	return ns.WithNetNSPath(id.Netns, func(ns.NetNS) error {
		if _, err := netlink.LinkByName(id.IfName); err != nil {
			return fmt.Errorf("%w: interface %q: %w", errPodGone, id.IfName, err)
		}
		return nil
	})
}

// grantHint names what a containerised villaged lacks when it cannot reach
// a pod's namespace at ADD (the plugin just made net1 there, so the
// namespace exists): the host's netns directory mounted into it, or the
// capability to enter a network namespace.
const grantHint = "villaged needs the host's netns directory mounted at the same path with mountPropagation HostToContainer and CAP_SYS_ADMIN to enter it (deploy/kubernetes/examples/homelab/daemonset-dhcp.yaml)"

// enterable checks, before an acquire, that villaged can see and enter the
// pod's namespace, saying what it lacks when not.
func (id identity) enterable() error {
	if _, err := os.Stat(id.Netns); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("netns %s is not visible to villaged: %s: %w", id.Netns, grantHint, err)
		}
		return fmt.Errorf("netns %s: %w", id.Netns, err)
	}
	err := ns.WithNetNSPath(id.Netns, func(ns.NetNS) error { return nil })
	// ns formats setns's errno with %v, so it is matched by its text.
	if err != nil && strings.Contains(err.Error(), syscall.EPERM.Error()) {
		return fmt.Errorf("entering netns %s: %s: %w", id.Netns, grantHint, err)
	}
	if err != nil {
		return fmt.Errorf("entering netns %s: %w", id.Netns, err)
	}
	return nil
}
