package testenv

import "strings"

// DiscoversAfterAck is how many DHCPDISCOVERs from mac on iface a dnsmasq
// log shows after the first DHCPACK to mac: a client that started over
// instead of renewing. DISCOVERs before that ACK are the client resending
// while it waits for an OFFER, which it rightly does after a second on a
// loaded machine, so they do not count.
func DiscoversAfterAck(log, iface, mac string) int {
	n, acked := 0, false
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, " "+mac) {
			continue
		}
		switch {
		case strings.Contains(line, " DHCPACK("+iface+") "):
			acked = true
		case acked && strings.Contains(line, " DHCPDISCOVER("+iface+") "):
			n++
		}
	}
	return n
}
