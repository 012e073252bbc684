// Package landhcp is villaged's DHCP client for LAN pods
// (`macvlan.ipam: {"type": "dhcp"}`): a lease manager that gets each pod's
// LAN address from the LAN's own DHCP server (the home router) and keeps
// it while the pod lives. The village plugin asks it through the agent's
// one socket (pkg/agentsock, op "dhcp"), which the agent serves and hands
// the requests of to Manager.Handle.
//
// Acquire runs DISCOVER, OFFER, REQUEST, ACK from inside the pod's network
// namespace on its macvlan interface, with the pod's MAC (the one the
// router's reservations know), a client identifier derived from that MAC
// and the pod's name as host name. The manager then renews the lease at T1
// (a REQUEST to the server that granted it), rebinds at T2 (the same
// REQUEST broadcast to any server), and at expiry takes the address off the
// interface, as RFC 2131 has a client stop using it, and keeps asking for
// one (the old address first). Release (the plugin's DEL) sends
// DHCPRELEASE. Leases are written under the state directory, so an agent
// restart resumes renewing them; an agent that is gone renews nothing and
// its leases lapse on the server: nothing is released on the way out.
//
// A DHCP socket is opened in the pod's namespace only for each exchange,
// never held between them: a held socket would keep the namespace (and
// its macvlan, with the pod's MAC) alive after the runtime removed it.
package landhcp
