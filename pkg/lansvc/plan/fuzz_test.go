package plan

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/lansvc/elect"
)

// FuzzPlan feeds the users' annotations (lan-share, lan-ip, the
// announcer) and ports of three Services in one namespace to Plan and
// Answer: they never panic, a group is written once, a group's accepted
// Services never share a port, a request names at most one address per
// family and only the families it asks for, the wants are sorted, and
// the status Ingress writes is one it then leaves alone.
func FuzzPlan(f *testing.F) {
	f.Add("k", "k", "", "192.168.1.5", "", uint16(80), uint16(80), uint16(443), uint8(0))
	f.Add("", "k", "k", "192.168.1.5,fd00::5", "fd00::5", uint16(80), uint16(81), uint16(81), uint8(3))
	f.Add("bad/key", "", "k", "nope", " 192.168.1.5 ", uint16(0), uint16(0), uint16(53), uint8(6))
	f.Fuzz(func(t *testing.T, shareA, shareB, shareC, ipA, ipB string, pA, pB, pC uint16, bits uint8) {
		mk := func(name, key, ip string, p uint16, i uint8) *corev1.Service {
			s := svc("lan", name, share(key), lanIP(ip), ports(int32(p)), age(int(i)))
			if bits&(1<<i) != 0 {
				udp(int32(p) + 1)(s)
				families(corev1.IPv6Protocol)(s)
			}
			if bits&(8<<i) != 0 {
				s.Annotations[kubenames.AnnotationLANAnnouncer] = "n1"
				ingress("192.168.1.5", "10.0.0.1")(s)
			}
			return s
		}
		svcs := []*corev1.Service{mk("a", shareA, ipA, pA, 0), mk("b", shareB, ipB, pB, 1), mk("c", shareC, "", pC, 2)}
		in := alone(svcs...)
		p := in.Plan()
		seen := map[store.Owner]bool{}
		for _, w := range p.Writes {
			if seen[w.Owner] {
				t.Fatalf("%s written twice", w.Owner.ContainerID)
			}
			seen[w.Owner] = true
			used := map[port]bool{}
			for _, s := range w.Services {
				for _, pt := range servicePorts(s) {
					if used[pt] {
						t.Fatalf("%s: port %v of %s taken in its group", w.Owner.ContainerID, pt, s.Name)
					}
					used[pt] = true
				}
			}
			fams := map[int]int{}
			for _, a := range w.Request.Addrs {
				fams[addrFamily(a)]++
				if !slices.Contains(w.Request.Families, addrFamily(a)) {
					t.Fatalf("%s: %s not of the families %v", w.Owner.ContainerID, a, w.Request.Families)
				}
			}
			if fams[4] > 1 || fams[6] > 1 {
				t.Fatalf("%s: addresses %v", w.Owner.ContainerID, w.Request.Addrs)
			}
		}
		in.Owners = map[store.Owner][]netip.Addr{}
		for o := range seen {
			in.Owners[o] = addrs("192.168.1.5")
		}
		a := in.Answer()
		if !slices.IsSortedFunc(a.Wants, func(x, y elect.Want) int { return x.Addr.Compare(y.Addr) }) {
			t.Fatalf("wants not sorted: %v", a.Wants)
		}
		for _, s := range svcs {
			ing, _ := Ingress(s, addrs("192.168.1.5"), inRanges)
			s.Status.LoadBalancer.Ingress = ing
			if _, changed := Ingress(s, addrs("192.168.1.5"), inRanges); changed && ing != nil {
				t.Fatalf("%s: Ingress changes its own %v", s.Name, ing)
			}
		}
	})
}
