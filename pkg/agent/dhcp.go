package agent

import (
	"context"
	"errors"
	"sync"

	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/landhcp"
	"github.com/village-cni/village/pkg/lanpods"
	"github.com/village-cni/village/pkg/netconf"
)

// agentSocket is where run serves the agent's one socket (pkg/agentsock):
// the config's "daemonSocketPath" when its LAN addresses come from DHCP
// and it names one, else agent.sock in runDir (where the plugin looks by
// default).
func (c *Conf) agentSocket(runDir string) string {
	if c.Net.LAN != nil && c.Net.LAN.IPAMType == netconf.LANDHCP && c.Net.LAN.DHCPSocket != "" {
		return c.Net.LAN.DHCPSocket
	}
	return agentsock.Path(runDir)
}

// dhcpFeature is the LAN pods' DHCP client (pkg/landhcp), on when the
// network's LAN addresses come from the LAN's DHCP server: it resumes the
// leases a previous agent left; the agent socket hands it the plugin's
// DHCP requests (sockHandler). Its leases are not released when the agent
// stops (a restart resumes them; an agent that stays away lets them
// lapse). It sets a.dhcp (nil without DHCP).
type dhcpFeature struct{}

func (dhcpFeature) Name() string { return "dhcp" }

func (dhcpFeature) Start(ctx context.Context, a *agent, wg *sync.WaitGroup) error {
	c, opts := a.c, a.opts
	if c.Net.LAN == nil || c.Net.LAN.IPAMType != netconf.LANDHCP {
		return nil
	}
	m := landhcp.New(ctx, opts.DHCPDir, opts.Logf)
	if n := m.Resume(); n > 0 {
		opts.logf("dhcp: resumed %d LAN leases", n)
	}
	wg.Go(func() {
		<-ctx.Done()
		m.Wait()
	})
	a.dhcp = m
	return nil
}

// Status: the leases are the LAN pods' (their lines say the addresses).
func (dhcpFeature) Status(context.Context, *view) ([]string, bool) { return nil, true }

// sockHandler answers the agent socket: the LAN pods' questions from the
// pkg/lanpods controller, the DHCP requests from the lease manager.
type sockHandler struct {
	*lanpods.Controller
	dhcp *landhcp.Manager
}

func (h sockHandler) DHCP(ctx context.Context, req agentsock.DHCPRequest) (agentsock.DHCPResponse, error) {
	if h.dhcp == nil {
		return agentsock.DHCPResponse{}, errors.New(`this agent's network has no "macvlan.ipam" of type dhcp; restart it after changing the config`)
	}
	return h.dhcp.Handle(ctx, req)
}
