package kube_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// noBandwidth takes the chained bandwidth plugin out of the home-lab
// ConfigMap: the release's image ships no bandwidth binary, so the
// ConfigMap its users run (and keep over the upgrade) chains none, and a
// pod's ADD and DEL through one that did would fail on the release.
var noBandwidth = [2]string{`,
        {
          "type": "bandwidth",
          "capabilities": { "bandwidth": true }
        }`, ``}

// TestLANStickyPods: the home-lab ConfigMap with "sticky" in its LAN pool
// (kept as Leases): a pod deleted on node-1 and created again with the same
// namespace/name on node-2 gets its LAN address back without naming it,
// another pod created meanwhile does not get it, and the LAN client reaches
// the pod at that address on node-2.
//
// The cluster starts on the last release (kubecluster.LastRelease: the
// newest release in RELEASES before the checkout, installed from its own manifests and
// image), with that ConfigMap and NetworkPolicy on, and is upgraded to the
// checkout first (checkUpgrade, upgrade_test.go): the sticky pods run on
// the upgraded cluster.
func TestLANStickyPods(t *testing.T) {
	release := kubecluster.LastRelease(t)
	c := kubecluster.Start(t, kubecluster.Options{Release: release})
	config := installLANConfig(t, c,
		[2]string{`"store": { "type": "kubernetes"`, `"sticky": "10m", "store": { "type": "kubernetes"`},
		[2]string{`"hairpinMode": true,`, `"hairpinMode": true, "networkPolicy": true,`},
		noBandwidth)
	if !t.Run("UpgradeFromRelease", func(t *testing.T) { checkUpgrade(t, c, release, config) }) {
		t.FailNow()
	}
	t.Run("Sticky", func(t *testing.T) { checkSticky(t, c) })
}

func checkSticky(t *testing.T, c *kubecluster.Cluster) {
	f := newFixture(t, c, "lan-sticky")
	labelNS(t, c, f.ns, kubenames.LabelLANAllowed)
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")
	want := map[string]string{kubenames.AnnotationLAN: "true"}
	create := func(name, nodeName string) string {
		p := podSpec(name, nodeName, corev1.RestartPolicyAlways, "-listen", ":8080", "-reply", name+"@"+nodeName)
		p.Annotations = want
		f.create(p)
		f.running(name)
		v := lanAddress(t, f, name)
		addr, ok := strings.CutPrefix(v, "net1=")
		if !ok {
			t.Fatalf("lan-address of %s: %q", name, v)
		}
		return strings.TrimSuffix(addr, "/24")
	}

	ip := create("db-0", n1.Name)
	deletePod(t, f, "db-0")
	if err := kubecluster.Poll(wait, func() error {
		ls, err := c.Client().CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, l := range ls.Items {
			if l.Annotations["village.cni.io/ipam-ip"] == ip && l.Annotations["village.cni.io/ipam-container-id"] == "village-hold_"+f.ns+"_db-0" {
				return nil
			}
		}
		return fmt.Errorf("no Lease holds %s for %s/db-0", ip, f.ns)
	}); err != nil {
		t.Fatalf("deleting db-0 did not hold its address: %v", err)
	}
	if other := create("web-0", n2.Name); other == ip {
		t.Fatalf("web-0 got %s, held for db-0", other)
	}
	if got := create("db-0", n2.Name); got != ip {
		t.Fatalf("db-0 on node-2 got %s, want its address %s back", got, ip)
	}
	must(t, testenv.Ping(c.LANClient(), ip, 5), "LAN client -> db-0 %s on node-2", ip)
	expect(t, "LAN client -> db-0 TCP on node-2", "db-0@"+n2.Name, dialIn(c.LANClient(), ip+":8080"))
}
