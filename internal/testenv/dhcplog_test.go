package testenv

import "testing"

func TestDiscoversAfterAck(t *testing.T) {
	const mac = "0e:00:00:00:00:01"
	line := func(msg string) string {
		return "Dec  4 05:00:00 dnsmasq-dhcp[7]: " + msg + "(lan0) 192.168.77.50 " + mac + " pod\n"
	}
	other := "Dec  4 05:00:00 dnsmasq-dhcp[7]: DHCPDISCOVER(lan0) 0e:00:00:00:00:02\n"
	for _, tc := range []struct {
		name, log string
		want      int
	}{
		{"one exchange", line("DHCPDISCOVER") + line("DHCPOFFER") + line("DHCPREQUEST") + line("DHCPACK"), 0},
		{"resent before the OFFER", line("DHCPDISCOVER") + line("DHCPDISCOVER") + line("DHCPOFFER") + line("DHCPOFFER") + line("DHCPREQUEST") + line("DHCPACK") + line("DHCPREQUEST") + line("DHCPACK"), 0},
		{"started over after the ACK", line("DHCPDISCOVER") + line("DHCPACK") + line("DHCPDISCOVER") + line("DHCPACK"), 1},
		{"another client's DISCOVER", line("DHCPDISCOVER") + line("DHCPACK") + other, 0},
		{"no ACK yet", line("DHCPDISCOVER") + line("DHCPDISCOVER"), 0},
	} {
		if got := DiscoversAfterAck(tc.log, "lan0", mac); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
