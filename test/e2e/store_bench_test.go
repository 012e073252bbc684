package e2e

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
)

// BenchmarkPodWithLANAddress measures ADD+DEL of a pod with a LAN interface
// whose pool is in the node-local disk store against the same pool in etcd
// (on a LAN host namespace), through libcni and the real binaries:
//
//	sudo go test ./test/e2e -run '^$' -bench PodWithLANAddress -benchtime 40x
func BenchmarkPodWithLANAddress(b *testing.B) {
	for _, store := range []string{"disk", "etcd"} {
		b.Run(store, func(b *testing.B) {
			lan := NewLAN(b)
			host := testenv.NewNS(b)
			lan.Attach(b, host, "eth0", "192.168.77.5/24")
			n := NewNode(b)
			lan.Attach(b, n.NS, "lan0", "192.168.77.10/24")
			storeConf := ""
			if store == "etcd" {
				etcd := etcdtest.StartIn(b, host, "192.168.77.5")
				storeConf = fmt.Sprintf(`,"store":{"type":"etcd","endpoints":[%q],"prefix":"/bench"}`, etcd.Endpoints[0])
			}
			l := ConfList(b, lanList(n, "bench"+store, "10.53.1.0/24", "192.168.77.200", "192.168.77.250", storeConf))
			pod := n.NewPod()
			b.ResetTimer()
			for range b.N {
				if _, err := n.Add(l, pod); err != nil {
					b.Fatal(err)
				}
				if err := n.Del(l, pod); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLANAddressSource measures a pod's ADD (DEL untimed) without a
// LAN interface, with one addressed from a village-ipam pool, with one at a
// fixed address of that pool (CNI_ARGS VILLAGE_LAN_IP, what the lan-ip
// annotation becomes), and with one addressed by the LAN's DHCP server
// (dnsmasq in the LAN, through villaged's DHCP client: a full DISCOVER..ACK
// each time, since DEL releases):
//
//	sudo go test ./test/e2e -run '^$' -bench LANAddressSource -benchtime 20x
func BenchmarkLANAddressSource(b *testing.B) {
	for _, source := range []string{"none", "pool", "fixed", "dhcp"} {
		b.Run(source, func(b *testing.B) {
			lab := newDHCPLab(b)
			dn := lab.newNode(b, "192.168.77.10")
			n := dn.Node
			var l string
			switch source {
			case "none":
				l = fmt.Sprintf(`{"cniVersion":"1.1.0","name":"benchnone","plugins":[{"type":"village","bridge":"vlg-none","isDefaultGateway":true,"ipMasq":true,
					"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.54.1.0/24"}]]}}]}`, filepath.Join(n.Dir, "pods"))
			case "pool", "fixed":
				l = lanList(n, "bench"+source, "10.54.1.0/24", "192.168.77.200", "192.168.77.250", "")
			case "dhcp":
				dn.start(b)
				l = dhcpList(n, dn.socket)
			}
			list := ConfList(b, l)
			pod := n.NewPod()
			b.ResetTimer()
			for range b.N {
				var err error
				if source == "fixed" {
					_, err = addArgs(n, list, pod, [2]string{"VILLAGE_LAN_IP", "192.168.77.220"})
				} else {
					_, err = n.Add(list, pod)
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := n.Del(list, pod); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
