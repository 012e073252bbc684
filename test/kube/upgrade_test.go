package kube_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/kubenames"
)

// checkUpgrade: on a cluster that runs release r (installed from its own
// deploy/kubernetes, with the user's ConfigMap config: the home-lab LAN
// and NetworkPolicy), pods run: a LAN pod, a pod behind a NetworkPolicy
// (ingress only from app=client) and a held TCP connection from node-1 to
// an echo server on node-2. Then the user's upgrade: `kubectl apply -f`
// the checkout's deploy/village.yaml with their ConfigMap in place of the
// shipped one. After the rollout on every node: the connection still
// carries bytes, every pod has its address, the LAN pod its LAN address
// and Lease, a prober from the LAN namespace never got an answer from the
// guarded pod (before, during and after the rollout) while the allowed
// client still gets through, the nodes' subnets and annotations are the
// release's, a new pod gets an address no old pod holds, and no node
// keeps a policy table under the release's names (village-policy-<net>,
// village-pending-<net>): the new agent filters with its own tables only.
func checkUpgrade(t *testing.T, c *kubecluster.Cluster, r *kubecluster.Release, config string) {
	ctx := context.Background()
	f := newFixture(t, c, "upgrade")
	labelNS(t, c, f.ns, kubenames.LabelLANAllowed)
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")
	agentImages := func() map[string]string {
		m := map[string]string{}
		for n, p := range villagePods(t, c) {
			for _, ct := range p.Spec.Containers {
				m[n] = ct.Image
			}
		}
		return m
	}
	for n, img := range agentImages() {
		if img != r.Image {
			t.Fatalf("the agent on %s runs %s, want release %s's %s", n, img, r.Tag, r.Image)
		}
	}
	if r.Image == buildinfo.Image {
		t.Fatalf("release %s and the checkout both run image %s: bump pkg/buildinfo's Image (and deploy/) past the release", r.Tag, r.Image)
	}

	if _, err := c.Client().NetworkingV1().NetworkPolicies(f.ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lan := podSpec("lan", n1.Name, corev1.RestartPolicyAlways, "-listen", ":8080", "-reply", "lan")
	lan.Annotations = map[string]string{kubenames.AnnotationLAN: "true"}
	f.create(lan)
	f.server("guarded", n2.Name)
	f.server("client", n1.Name)
	f.create(podSpec("echo", n2.Name, corev1.RestartPolicyAlways, "-echo", ":9000"))
	pods := f.running("lan", "guarded", "client", "echo")
	target := pods["echo"].Status.PodIP + ":9000"
	// Exits 1 the moment its connection breaks, and is never restarted.
	f.create(podSpec("hold", n1.Name, corev1.RestartPolicyNever, "-dial", target))
	f.running("hold")
	waitLog(t, c, f.ns, "hold", func(log string) bool { return lastOK(log) > 0 })

	lanIP := strings.TrimSuffix(strings.TrimPrefix(lanAddress(t, f, "lan"), "net1="), "/24")
	guarded := pods["guarded"].Status.PodIP
	expect(t, "LAN client -> lan pod "+lanIP, "lan", dialIn(c.LANClient(), lanIP+":8080"))
	expect(t, "client -> guarded (allowed)", "guarded", f.tcpFromPod("client", guarded, 8080))
	if err := kubecluster.Poll(wait, func() error {
		if answered(c.LAN(), guarded) {
			return fmt.Errorf("guarded %s still answers the LAN", guarded)
		}
		return nil
	}); err != nil {
		t.Fatalf("the policy on release %s: %v", r.Tag, err)
	}
	oldTables := policyTables(t, c, true)
	if len(oldTables) == 0 {
		t.Fatalf("release %s wrote no policy table under its names (inet village-policy-<net>) on any node", r.Tag)
	}
	lease := lanLease(t, c, lanIP)
	nodes := nodeState(t, c)
	addrs := podAddresses(t, f)

	// The user's upgrade: the new one-file install, their ConfigMap kept.
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	file := upgradeFile(t, filepath.Join(root, "deploy", "village.yaml"), config)
	pr := startRebootProber(c, f.ns, "guarded")
	t.Cleanup(func() { pr.stop() })
	pr.waitSent(t, 10)
	okBefore := lastOK(logs(t, c, f.ns, "hold"))
	start := time.Now()
	if out, err := c.Kubectl("apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply -f deploy/village.yaml: %v\n%s", err, out)
	}
	if err := kubecluster.Poll(wait, func() error {
		for n, img := range agentImages() {
			if img != buildinfo.Image {
				return fmt.Errorf("the agent on %s runs %s", n, img)
			}
		}
		return c.WaitVillageReady(0)
	}); err != nil {
		t.Fatalf("rollout from %s to %s: %v", r.Image, buildinfo.Image, err)
	}
	rolled := time.Since(start)

	// The connection carries on past where it stood when the last agent
	// was Ready.
	okRolled := lastOK(logs(t, c, f.ns, "hold"))
	waitLog(t, c, f.ns, "hold", func(log string) bool { return lastOK(log) > okRolled || strings.Contains(log, "broken") })
	holdLog := logs(t, c, f.ns, "hold")
	if strings.Contains(holdLog, "broken") {
		t.Errorf("hold lost its connection to %s over the upgrade:\n%s", target, holdLog)
	}
	okAfter := lastOK(holdLog)
	if after := podAddresses(t, f); fmt.Sprint(after) != fmt.Sprint(addrs) {
		t.Errorf("pod addresses changed over the upgrade:\nbefore %v\nafter  %v", addrs, after)
	}
	if got := strings.TrimSuffix(strings.TrimPrefix(lanAddress(t, f, "lan"), "net1="), "/24"); got != lanIP {
		t.Errorf("the LAN pod's address: %s after the upgrade, %s before", got, lanIP)
	}
	expect(t, "LAN client -> lan pod after the upgrade", "lan", dialIn(c.LANClient(), lanIP+":8080"))
	if got := lanLease(t, c, lanIP); got != lease {
		t.Errorf("the Lease of %s: %s after the upgrade, %s before", lanIP, got, lease)
	}
	pr.waitSent(t, 10)
	sent, got, last := pr.stop()
	if got != 0 {
		t.Errorf("%d of %d probes from the LAN to guarded %s were answered over the upgrade (last: %s)", got, sent, guarded, last)
	}
	expect(t, "client -> guarded (allowed) after the upgrade", "guarded", f.tcpFromPod("client", guarded, 8080))
	if err := kubecluster.Poll(wait, func() error {
		if old := policyTables(t, c, true); len(old) > 0 {
			return fmt.Errorf("old-named policy tables left: %v", old)
		}
		if len(policyTables(t, c, false)) == 0 {
			return fmt.Errorf("no node has a policy table under the new names (inet village_policy-<net>)")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	newTables := policyTables(t, c, false)
	after := nodeState(t, c)
	for n, kv := range nodes {
		for k, v := range kv {
			if after[n][k] != v {
				t.Errorf("node %s: %s is %q after the upgrade, %q before", n, k, after[n][k], v)
			}
		}
	}
	// The new IPAM reads the release's allocations: a pod started now
	// gets an address no running pod holds.
	f.server("fresh", n1.Name)
	fresh := f.running("fresh")["fresh"].Status.PodIP
	for k, ip := range addrs {
		if ip == fresh {
			t.Errorf("the new pod got %s, which %s holds since before the upgrade", fresh, k)
		}
	}
	expect(t, "client -> fresh pod", "fresh", f.tcpFromPod("client", fresh, 8080))
	t.Logf("upgrade %s (%s) -> %s: rollout on %d nodes in %s; held connection %s: %d lines (%d bytes each way) before the apply, %d at the rollout's end, %d after (%d bytes); %d probes from the LAN to guarded %s during the upgrade, %d answered; LAN pod %s, Lease %s; pod addresses kept %v; policy tables before %v, after %v; nodes %v; new pod %s",
		r.Tag, r.Commit[:7], buildinfo.Image, len(nodes), rolled.Round(100*time.Millisecond), target,
		okBefore, echoBytes(okBefore), okRolled, okAfter, echoBytes(okAfter), sent, guarded, got, lanIP, lease,
		slices.Sorted(maps.Values(addrs)), oldTables, newTables, nodes, fresh)
}

// echoBytes is how many bytes the hold client wrote (and read back) by
// its n-th line: "1\n" ... "n\n".
func echoBytes(n int) int {
	b := 0
	for i := 1; i <= n; i++ {
		b += len(fmt.Sprint(i)) + 1
	}
	return b
}

// upgradeFile writes the one-file install with the ConfigMap village-config
// replaced by the user's (config): what they apply to upgrade without
// losing their configuration.
func upgradeFile(t *testing.T, oneFile, config string) string {
	t.Helper()
	b, err := os.ReadFile(oneFile)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	n := 0
	for i, d := range docs {
		if strings.Contains(d, "\nkind: ConfigMap\n") && strings.Contains(d, "\n  name: village-config\n") {
			docs[i] = string(mine)
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s holds %d ConfigMaps village-config, want 1", oneFile, n)
	}
	out := filepath.Join(t.TempDir(), "village.yaml")
	if err := os.WriteFile(out, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// policyTables lists the nodes' NetworkPolicy tables ("node: table"):
// under the release's names (village-policy-, village-pending-) with old,
// else under the current ones (village_policy-, village_pending-).
func policyTables(t *testing.T, c *kubecluster.Cluster, old bool) []string {
	t.Helper()
	prefixes := []string{"village_policy-", "village_pending-"}
	if old {
		prefixes = []string{"village-policy-", "village-pending-"}
	}
	var found []string
	for _, n := range c.Nodes() {
		out, err := n.Exec("nft", "list", "tables")
		if err != nil {
			t.Fatalf("nft list tables on %s: %v\n%s", n.Name, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			name := l[strings.LastIndex(l, " ")+1:]
			for _, p := range prefixes {
				if strings.HasPrefix(name, p) {
					found = append(found, n.Name+": "+name)
				}
			}
		}
	}
	return found
}

// lanLease is the Lease holding ip on the LAN ("name by container").
func lanLease(t *testing.T, c *kubecluster.Cluster, ip string) string {
	t.Helper()
	ls, err := c.Client().CoordinationV1().Leases(kubecluster.VillageNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls.Items {
		if l.Annotations[kubenames.AnnotationIPAMIP] == ip {
			return l.Name + " by " + l.Annotations[kubenames.AnnotationIPAMContainer]
		}
	}
	t.Fatalf("no Lease holds %s", ip)
	return ""
}

// nodeState is each node's pod subnet and Village annotations.
func nodeState(t *testing.T, c *kubecluster.Cluster) map[string]map[string]string {
	t.Helper()
	list, err := c.Client().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]map[string]string{}
	for _, n := range list.Items {
		kv := map[string]string{"podCIDR": n.Spec.PodCIDR}
		for k, v := range n.Annotations {
			if strings.HasPrefix(k, kubenames.Prefix) {
				kv[k] = v
			}
		}
		m[n.Name] = kv
	}
	return m
}
