package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestAgentProbesBeforeSubnet: the agent's probes answer from its first
// second, against a real kube-apiserver. While its Node has no
// spec.podCIDRs, /healthz is 200 (the agent is alive and waiting, no reason
// to restart it) and /readyz is 503 naming the missing subnet; once the
// podCIDR is set, /readyz turns 200. A restarted agent answers the same way
// (it holds the subnet from the start).
func TestAgentProbesBeforeSubnet(t *testing.T) {
	lab := newKubeLab(t, "host-gw")
	n1 := lab.nodes[0]
	lab.createNode(n1, "")
	lab.start(n1)

	const healthz, readyz = "http://127.0.0.1:9696/healthz", "http://127.0.0.1:9696/readyz"
	waitFor(t, 30*time.Second, "node1's agent waits for its podCIDR, alive and not ready", func() (bool, string) {
		hb, hc := httpGetIn(t, n1.NS, healthz)
		rb, rc := httpGetIn(t, n1.NS, readyz)
		waiting := strings.Contains(n1.log.String(), "no spec.podCIDRs yet")
		return waiting && hc == 200 && rc == 503 && strings.Contains(rb, "no pod subnet"),
			fmt.Sprintf("healthz %d %s; readyz %d %s\n%s", hc, hb, rc, rb, n1.log.String())
	})
	if s := n1.subnet(t); s != "" {
		t.Fatalf("node1 published a subnet before its Node had one: %q", s)
	}

	patch := []byte(`{"spec":{"podCIDR":"10.70.1.0/24","podCIDRs":["10.70.1.0/24"]}}`)
	_, err := lab.kube.Client.CoreV1().Nodes().Patch(context.Background(), n1.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	must(t, err, "setting node1's podCIDR")
	waitFor(t, 60*time.Second, "node1 is ready once it holds its subnet", func() (bool, string) {
		rb, rc := httpGetIn(t, n1.NS, readyz)
		return rc == 200 && strings.Contains(n1.subnet(t), "10.70.1.0/24"), fmt.Sprintf("readyz %d %s\n%s", rc, rb, n1.log.String())
	})

	must(t, n1.stop(t, syscall.SIGTERM), "stopping node1's agent")
	lab.start(n1)
	waitFor(t, 60*time.Second, "the restarted agent is alive and ready again", func() (bool, string) {
		hb, hc := httpGetIn(t, n1.NS, healthz)
		rb, rc := httpGetIn(t, n1.NS, readyz)
		return hc == 200 && rc == 200, fmt.Sprintf("healthz %d %s; readyz %d %s\n%s", hc, hb, rc, rb, n1.log.String())
	})
}
