package macvlan

import (
	"crypto/sha256"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
)

// StableMAC is the LAN interface's MAC of a Kubernetes pod: derived from
// the network and the pod's namespace and name, so the same pod (a
// StatefulSet's db-0 restarted, or rescheduled on another node) keeps its
// MAC, and LAN hosts' neighbour caches and a router's DHCP reservations
// stay valid for it. Locally administered and unicast (the first byte's
// bits 1 and 0 are 1 and 0); 46 bits of SHA-256, so two pods of a LAN of a
// few thousand share one with a probability far below 1e-6.
func StableMAC(network, namespace, name string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("village-lan-mac\x00" + network + "\x00" + namespace + "\x00" + name))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// AnnounceOnUp has the kernel announce the pod interface ifName's
// addresses when it comes up: net.ipv4.conf.<if>.arp_notify (a gratuitous
// ARP for each IPv4 address on NETDEV_UP) and, with v6,
// net.ipv6.conf.<if>.ndisc_notify (an unsolicited neighbour advertisement).
// So after a pod moves to another node, a LAN host that still has its
// address cached with the old port (a switch's FDB) or an old MAC learns
// the new one at once instead of when its entry expires. The kernel's
// announcement rather than a packet library: it is sent at exactly the
// moment the addresses become usable, by the code that owns them, needs
// no raw socket in the plugin and no new dependency.
func AnnounceOnUp(podNS ns.NetNS, ifName string, v6 bool) error {
	return podNS.Do(func(ns.NetNS) error {
		if _, err := sysctl.Sysctl(fmt.Sprintf("net/ipv4/conf/%s/arp_notify", ifName), "1"); err != nil {
			return fmt.Errorf("failed to set arp_notify on %q: %w", ifName, err)
		}
		if v6 {
			if _, err := sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/ndisc_notify", ifName), "1"); err != nil {
				return fmt.Errorf("failed to set ndisc_notify on %q: %w", ifName, err)
			}
		}
		return nil
	})
}
