package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/kuberegistry"
	"github.com/village-cni/village/pkg/overlay"
)

// The kubernetes registry feeds the agent changed records only: after many
// Nodes are created (before and after the agent starts), moved, turned into
// non-peers, deleted and created again, in parallel, the agent's routes,
// permanent neighbours and FDB entries are exactly what the API server's
// final Nodes say, with both backends.
func TestAgentKubeChangesConverge(t *testing.T) {
	for _, mode := range []string{"vxlan", "host-gw"} {
		t.Run(mode, func(t *testing.T) { kubeChangesConverge(t, mode) })
	}
}

func kubeChangesConverge(t *testing.T, mode string) {
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", agentEtcdIP+"/24")
	kube := kubetest.Start(t, kubetest.Options{NetNS: host, IP: agentEtcdIP})
	ctx := context.Background()
	api := kube.Client.CoreV1().Nodes()

	w := NewNode(t)
	lan.Attach(t, w.NS, "lan0", agentLANPrefix+"11/24")
	testenv.MustIP(t, w.NS, "addr", "add", "172.21.255.250"+cpLANNet, "dev", "lan0")
	const self = "watcher"
	_, err := api.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self},
		Spec: corev1.NodeSpec{PodCIDR: "10.120.0.0/24", PodCIDRs: []string{"10.120.0.0/24"}}}, metav1.CreateOptions{})
	must(t, err, "creating Node %s", self)

	const n = 400
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	create := func(items []int, gen int) {
		cpParallel(items, func(i int) {
			if _, err := api.Create(ctx, cpNode(mode, i, gen), metav1.CreateOptions{}); err != nil {
				t.Errorf("creating Node %d: %v", i, err)
			}
		})
	}
	patch := func(i int, ann map[string]any) {
		p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		if _, err := api.Patch(ctx, fmt.Sprintf("n%04d", i), types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
			t.Errorf("patching Node %d: %v", i, err)
		}
	}
	create(all[:n/2], 0) // in the agent's first list

	conf := filepath.Join(w.Dir, "agt.conflist")
	must(t, os.WriteFile(conf, []byte(kubeConflist(mode, filepath.Join(w.Dir, "ipam"), kube.AdminKubeconfig)), 0o644), "writing the conflist")
	log, _ := runVillaged(t, w, conf, self, "1h") // no periodic pass: the events alone
	create(all[n/2:], 0)                          // watched
	waitFor(t, 5*time.Minute, "the agent has a route to each of the first Nodes", func() (bool, string) {
		got := kernelState(t, w, mode)
		return strings.Count(got, "route ") >= n, log.String()
	})

	cpParallel(all, func(i int) {
		switch i % 8 {
		case 0, 1: // moves
			ip := cpIP(i, 1)
			ann := map[string]any{}
			for k, v := range cpAnnotations(mode, ip, overlay.DeriveMAC(net.ParseIP(ip)).String()) {
				ann[k] = v
			}
			patch(i, ann)
		case 2: // no longer a peer
			patch(i, map[string]any{kubenames.AnnotationUnderlayIP: nil})
		case 3, 4: // leaves
			if err := api.Delete(ctx, fmt.Sprintf("n%04d", i), metav1.DeleteOptions{}); err != nil {
				t.Errorf("deleting Node %d: %v", i, err)
			}
		case 5: // a change Village does not read
			patch(i, map[string]any{"example.com/other": "x"})
		}
	})
	var again []int
	for i := 4; i < n; i += 16 {
		again = append(again, i) // deleted above, back with a new address
	}
	create(again, 1) // (gen 1 addresses are on the watcher's LAN, as host-gw needs)

	want := wantedState(t, api, mode, self)
	if strings.Count(want, "route ") < n/2 {
		t.Fatalf("the API server's Nodes give only:\n%s", want)
	}
	waitFor(t, 5*time.Minute, "the kernel is exactly what the Nodes say", func() (bool, string) {
		got := kernelState(t, w, mode)
		return got == want, diffLines(want, got) + "\n" + tailString(log.String(), 3000)
	})
}

// wantedState is the routes, neighbours and FDB entries the API server's
// Nodes ask of a watcher, one sorted line each (kernelState's form).
func wantedState(t *testing.T, api interface {
	List(context.Context, metav1.ListOptions) (*corev1.NodeList, error)
}, mode, self string) string {
	list, err := api.List(context.Background(), metav1.ListOptions{})
	must(t, err, "listing Nodes")
	var lines []string
	for i := range list.Items {
		node := &list.Items[i]
		rec, ok, err := kuberegistry.Record(node)
		must(t, err, "Node %s", node.Name)
		if !ok || node.Name == self {
			continue
		}
		cidr := rec.PodCIDRs[0]
		if mode == "host-gw" {
			lines = append(lines, fmt.Sprintf("route %s via %s dev lan0", cidr, rec.IP))
			continue
		}
		vtep := strings.TrimSuffix(cidr, "/24")
		lines = append(lines, fmt.Sprintf("route %s via %s dev village.9", cidr, vtep),
			fmt.Sprintf("neigh %s lladdr %s", vtep, rec.VtepMAC),
			fmt.Sprintf("fdb %s dst %s", rec.VtepMAC, rec.IP))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// kernelState is the watcher's Village routes (protocol 86), and with
// vxlan the permanent neighbours and FDB entries of its VXLAN device, one
// sorted line each.
func kernelState(t *testing.T, w *Node, mode string) string {
	var lines []string
	var routes []struct{ Dst, Gateway, Dev string }
	ipJSON(t, w, &routes, "ip", "-j", "route", "show", "proto", "86")
	for _, r := range routes {
		lines = append(lines, fmt.Sprintf("route %s via %s dev %s", r.Dst, r.Gateway, r.Dev))
	}
	if mode == "vxlan" {
		var neighs []struct{ Dst, Lladdr string }
		ipJSON(t, w, &neighs, "ip", "-j", "neigh", "show", "nud", "permanent", "dev", "village.9")
		for _, n := range neighs {
			lines = append(lines, fmt.Sprintf("neigh %s lladdr %s", n.Dst, n.Lladdr))
		}
		var fdbs []struct{ Mac, Dst string }
		ipJSON(t, w, &fdbs, "bridge", "-j", "fdb", "show", "dev", "village.9")
		for _, f := range fdbs {
			if f.Dst != "" {
				lines = append(lines, fmt.Sprintf("fdb %s dst %s", f.Mac, f.Dst))
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func ipJSON(t *testing.T, w *Node, v any, argv ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", w.Name()}, argv...)...).Output()
	if err != nil {
		return // the VXLAN device is not there yet: nothing
	}
	if len(strings.TrimSpace(string(out))) == 0 {
		return
	}
	must(t, json.Unmarshal(out, v), "decoding %v", argv)
}

// diffLines names the lines only one of want and got has.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			fmt.Fprintf(&b, "missing: %s\n", l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			fmt.Fprintf(&b, "extra:   %s\n", l)
		}
	}
	return b.String()
}
