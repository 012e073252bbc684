package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestAgentProbesBeforeSubnet: the agent's probes answer from its first
// second, against a real kube-apiserver, and the runtime's config directory
// gets the conflist only once the agent holds the pod subnet (the
// DaemonSet's way: the conflist staged, `villaged run --publish-conf-dir`).
// While its Node has no spec.podCIDRs, the config directory is empty,
// /healthz is 200 (the agent is alive and waiting, no reason to restart it)
// and /readyz is 503 naming the missing subnet; once the podCIDR is set the
// conflist is there and /readyz turns 200. A restarted agent leaves the
// conflist in place throughout and is ready again.
func TestAgentProbesBeforeSubnet(t *testing.T) {
	lab := newKubeLab(t, "host-gw")
	n1 := lab.nodes[0]
	lab.createNode(n1, "")
	confDir := filepath.Join(n1.Dir, "net.d")
	must(t, os.MkdirAll(confDir, 0o755), "making the config directory")
	published := filepath.Join(confDir, filepath.Base(lab.conf))
	start := func() {
		cmd := n1.villaged(t, append([]string{"run", "--conf", lab.conf, "--node-name", n1.name, "--run-dir", n1.runDir, "--publish-conf-dir", confDir}, lab.periodArgs()...)...)
		cmd.Stdout, cmd.Stderr = n1.log, n1.log
		must(t, cmd.Start(), "starting villaged on %s", n1.name)
		n1.cmd, n1.exited = cmd, make(chan error, 1)
		go func() { n1.exited <- cmd.Wait() }()
	}
	start()

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
	if entries, err := os.ReadDir(confDir); err != nil || len(entries) != 0 {
		t.Fatalf("the config directory before the subnet: %v %v", entries, err)
	}

	patch := []byte(`{"spec":{"podCIDR":"10.70.1.0/24","podCIDRs":["10.70.1.0/24"]}}`)
	_, err := lab.kube.Client.CoreV1().Nodes().Patch(context.Background(), n1.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	must(t, err, "setting node1's podCIDR")
	waitFor(t, 60*time.Second, "node1 is ready once it holds its subnet", func() (bool, string) {
		rb, rc := httpGetIn(t, n1.NS, readyz)
		return rc == 200 && strings.Contains(n1.subnet(t), "10.70.1.0/24"), fmt.Sprintf("readyz %d %s\n%s", rc, rb, n1.log.String())
	})
	want, err := os.ReadFile(lab.conf)
	must(t, err, "reading the staged conflist")
	conflistThere := func(when string) {
		t.Helper()
		if got, err := os.ReadFile(published); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: published conflist %s: %v (%d bytes, want the staged %d)", when, published, err, len(got), len(want))
		}
	}
	conflistThere("after the subnet")

	must(t, n1.stop(t, syscall.SIGTERM), "stopping node1's agent")
	conflistThere("agent stopped")
	start()
	waitFor(t, 60*time.Second, "the restarted agent is alive and ready again", func() (bool, string) {
		conflistThere("agent restarting")
		hb, hc := httpGetIn(t, n1.NS, healthz)
		rb, rc := httpGetIn(t, n1.NS, readyz)
		return hc == 200 && rc == 200, fmt.Sprintf("healthz %d %s; readyz %d %s\n%s", hc, hb, rc, rb, n1.log.String())
	})
	conflistThere("agent restarted")
}
