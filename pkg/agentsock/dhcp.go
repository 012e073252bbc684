package agentsock

import "time"

// DHCP ops: the Op of a DHCPRequest, carried by a Request of op "dhcp".
// The DHCP exchanges run in the agent (pkg/landhcp), which outlives the
// plugin's process and so can renew the lease while the pod lives.
const (
	DHCPAcquire = "acquire" // DISCOVER..ACK from inside the pod, then renew while it lives
	DHCPRelease = "release" // DHCPRELEASE and forget the lease (DEL)
	DHCPCheck   = "check"   // the lease is held and not expired (CHECK)
	DHCPStatus  = "status"  // the lease manager answers (STATUS)
	DHCPGC      = "gc"      // release every lease whose attachment is not in Valid (GC)
)

// Attachment names one pod interface: the CNI container ID and the LAN
// interface's name.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// DHCPRequest is the payload of op "dhcp": what the plugin asks the
// agent's DHCP lease manager.
type DHCPRequest struct {
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
	// Valid lists the attachments that live, for DHCPGC.
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

// DHCPResponse is the payload of an answer to op "dhcp": the lease
// (DHCPAcquire, DHCPCheck) and the number of leases released (DHCPGC). A
// refusal is the Response's Error and Code.
type DHCPResponse struct {
	Lease    *Lease `json:"lease,omitempty"`
	Released int    `json:"released,omitempty"`
}
