package agent

import (
	"context"
	"sync"

	"github.com/village-cni/village/pkg/landhcp"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// dhcpSocket is where run serves the LAN DHCP client: the config's
// "daemonSocketPath", else dhcp.sock in the run directory (where the
// plugin looks by default, wire.SocketPath; nodelocal.DHCPSocket).
func (c *Conf) dhcpSocket(opts Options) string {
	if c.Net.LAN.DHCPSocket != "" {
		return c.Net.LAN.DHCPSocket
	}
	return nodelocal.DHCPSocket(opts.RunDir)
}

// startDHCP runs the LAN pods' DHCP client (pkg/landhcp) when the network's
// LAN addresses come from the LAN's DHCP server: it resumes the leases a
// previous agent left and serves the plugin's socket until ctx ends. Its
// leases are not released when the agent stops (a restart resumes them;
// an agent that stays away lets them lapse).
func startDHCP(ctx context.Context, c *Conf, opts Options, wg *sync.WaitGroup) {
	if c.Net.LAN == nil || c.Net.LAN.IPAMType != netconf.LANDHCP {
		return
	}
	m := landhcp.New(ctx, opts.DHCPDir, opts.Logf)
	if n := m.Resume(); n > 0 {
		opts.logf("dhcp: resumed %d LAN leases", n)
	}
	socket := c.dhcpSocket(opts)
	wg.Go(func() {
		defer m.Wait()
		opts.logf("dhcp: serving LAN leases on %s", socket)
		if err := landhcp.Serve(ctx, socket, m); err != nil {
			opts.logf("dhcp: %v", err)
		}
	})
}
