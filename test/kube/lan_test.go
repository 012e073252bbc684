package kube_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// The LAN pool of TestLANPods: four addresses of the cluster's LAN (its
// namespace .1, nodes .11/.12, LAN client .200 stay outside).
const (
	lanFirst = kubecluster.LANPrefix + "100"
	lanFixed = kubecluster.LANPrefix + "102"
	lanLast  = kubecluster.LANPrefix + "103"
	lanPool  = 4
)

// TestLANPods: pods on the LAN the Kubernetes way (issue 21), on the
// shipped DaemonSet with deploy/kubernetes/examples/homelab's ConfigMap
// (pods "annotated", a pool kept as Leases through the credentials the
// agent writes): with and without the annotation, a forbidden namespace,
// a fixed address, a taken one, pool exhaustion, the LAN client and the
// node reaching a LAN pod, the same address and MAC after a move to the
// other node announced by gratuitous ARP, deletion releasing the address,
// the lan-address annotation and the Events; then LoadBalancer Services on
// the LAN (issue 39, lanServices) with kube-proxy in iptables mode.
func TestLANPods(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	installLANConfig(t, c)
	ok := newFixture(t, c, "lan-ok")
	labelNS(t, c, ok.ns, kubenames.LabelLANAllowed)
	no := newFixture(t, c, "lan-no")
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")

	lanPod := func(f *fixture, name, nodeName string, ann map[string]string) {
		p := podSpec(name, nodeName, corev1.RestartPolicyAlways, "-listen", ":8080", "-reply", name)
		p.Annotations = ann
		f.create(p)
	}
	want := map[string]string{kubenames.AnnotationLAN: "true"}
	lanPod(ok, "plain", n1.Name, nil)
	lanPod(ok, "lan-a", n1.Name, want)
	lanPod(ok, "fixed", n2.Name, map[string]string{kubenames.AnnotationLANIP: lanFixed})
	ok.running("plain", "lan-a", "fixed")

	t.Run("WithoutAnnotationNoLAN", func(t *testing.T) {
		out, err := ok.exec("plain", "ip", "-o", "link")
		if err != nil || !strings.Contains(out, "eth0") || strings.Contains(out, "net1") {
			t.Fatalf("pod without the annotation: links %q (%v), want eth0 and no net1", out, err)
		}
	})
	var lanA string
	t.Run("AnnotatedGetsLANAddress", func(t *testing.T) {
		v := lanAddress(t, ok, "lan-a")
		addr, found := strings.CutPrefix(v, "net1=")
		if !found || !strings.HasSuffix(addr, "/24") {
			t.Fatalf("lan-address %q, want net1=<addr>/24", v)
		}
		lanA = strings.TrimSuffix(addr, "/24")
		out, err := ok.exec("lan-a", "ip", "-o", "addr", "show", "dev", "net1")
		if err != nil || !strings.Contains(out, lanA+"/24") {
			t.Fatalf("net1 of lan-a: %q (%v), want %s", out, err, lanA)
		}
	})
	t.Run("LANClientPingAndTCP", func(t *testing.T) {
		must(t, testenv.Ping(c.LANClient(), lanA, 5), "LAN client -> lan-a %s", lanA)
		expect(t, "LAN client -> lan-a TCP", "lan-a", dialIn(c.LANClient(), lanA+":8080"))
		expect(t, "LAN client -> fixed TCP", "fixed", dialIn(c.LANClient(), lanFixed+":8080"))
	})
	t.Run("NodeThroughHostShim", func(t *testing.T) {
		expect(t, "node-1 -> its own pod's LAN address through the shim", "lan-a", dialIn(n1.NetNS, lanA+":8080"))
	})
	t.Run("FixedAddress", func(t *testing.T) {
		if v := lanAddress(t, ok, "fixed"); v != "net1="+lanFixed+"/24" {
			t.Fatalf("lan-address of fixed: %q, want net1=%s/24", v, lanFixed)
		}
		if !leaseHolds(t, c, lanFixed) {
			t.Fatalf("no Lease holds %s", lanFixed)
		}
	})
	t.Run("TakenAddressEvent", func(t *testing.T) {
		lanPod(ok, "dup", n1.Name, map[string]string{kubenames.AnnotationLANIP: lanFixed})
		waitEvent(t, ok, "dup", kubenames.ReasonLANTaken, lanFixed)
		deletePod(t, ok, "dup")
	})
	t.Run("OutsidePoolEvent", func(t *testing.T) {
		lanPod(ok, "outside", n1.Name, map[string]string{kubenames.AnnotationLANIP: kubecluster.LANPrefix + "50"})
		waitEvent(t, ok, "outside", kubenames.ReasonLANOutsidePool, "outside the LAN pool")
		deletePod(t, ok, "outside")
	})
	t.Run("ForbiddenNamespaceEvent", func(t *testing.T) {
		lanPod(no, "asks", n1.Name, want)
		ev := waitEvent(t, no, "asks", kubenames.ReasonLANForbidden, kubenames.LabelLAN)
		// The refusal fails the sandbox's ADD, which kubelet reports: no
		// sandbox of the pod comes up, so it has no net1 (and no address).
		waitEvent(t, no, "asks", "FailedCreatePodSandBox", kubenames.LabelLAN)
		p, err := no.c.Client().CoreV1().Pods(no.ns).Get(context.Background(), "asks", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ev.InvolvedObject.UID != p.UID {
			t.Fatalf("the %s Event is about pod UID %q, want the pod's %q", kubenames.ReasonLANForbidden, ev.InvolvedObject.UID, p.UID)
		}
		if v, ok := p.Annotations[kubenames.AnnotationLANAddress]; ok {
			t.Fatalf("the refused pod has %s %q", kubenames.AnnotationLANAddress, v)
		}
		if p.Status.PodIP != "" {
			t.Fatalf("the refused pod has address %s: a sandbox of it came up", p.Status.PodIP)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil {
				t.Fatalf("container %s of the refused pod ran: %+v", cs.Name, cs.State)
			}
		}
		deletePod(t, no, "asks")
	})
	t.Run("PoolExhaustedEvent", func(t *testing.T) {
		var names []string
		for i := range lanPool - 2 { // lan-a and fixed hold two
			names = append(names, fmt.Sprintf("fill-%d", i))
			lanPod(ok, names[i], n2.Name, want)
		}
		ok.running(names...)
		lanPod(ok, "one-too-many", n2.Name, want)
		waitEvent(t, ok, "one-too-many", kubenames.ReasonLANExhausted, lanFirst)
		for _, n := range append(names, "one-too-many") {
			deletePod(t, ok, n)
		}
	})
	t.Run("SameAddressAfterMoveAnnounced", func(t *testing.T) {
		mac, err := ok.exec("fixed", "cat", "/sys/class/net/net1/address")
		mac = strings.TrimSpace(mac)
		if err != nil || mac == "" {
			t.Fatalf("MAC of fixed's net1: %q %v", mac, err)
		}
		must(t, testenv.Ping(c.LANClient(), lanFixed, 5), "LAN client -> fixed before the move")
		deletePod(t, ok, "fixed")
		if err := kubecluster.Poll(wait, func() error {
			if leaseHolds(t, c, lanFixed) {
				return fmt.Errorf("a Lease still holds %s", lanFixed)
			}
			return nil
		}); err != nil {
			t.Fatalf("deleting fixed did not release its address: %v", err)
		}
		// A neighbour entry the LAN client would use as it is: only an
		// announcement from the pod (the kernel's gratuitous ARP on its
		// net1 coming up, arp_notify) can change it before the client
		// sends anything.
		const stale = "02:00:00:00:00:01"
		testenv.MustIP(t, c.LANClient(), "neigh", "replace", lanFixed, "lladdr", stale, "dev", "eth0", "nud", "stale")
		lanPod(ok, "fixed", n1.Name, map[string]string{kubenames.AnnotationLANIP: lanFixed})
		ok.running("fixed")
		got, err := ok.exec("fixed", "cat", "/sys/class/net/net1/address")
		if err != nil || strings.TrimSpace(got) != mac {
			t.Fatalf("fixed's MAC on node-1 %q (%v), want %s as on node-2 (derived from namespace/name)", got, err, mac)
		}
		if err := kubecluster.Poll(wait, func() error {
			out := testenv.MustIP(t, c.LANClient(), "neigh", "show", lanFixed, "dev", "eth0")
			if !strings.Contains(out, mac) {
				return fmt.Errorf("LAN client's neighbour entry %q", out)
			}
			return nil
		}); err != nil {
			t.Fatalf("no announcement from fixed on node-1: %v", err)
		}
		expect(t, "LAN client -> fixed on node-1", "fixed", dialIn(c.LANClient(), lanFixed+":8080"))
		if v := lanAddress(t, ok, "fixed"); v != "net1="+lanFixed+"/24" {
			t.Fatalf("lan-address after the move: %q", v)
		}
	})
	t.Run("StatusListsLANPods", func(t *testing.T) {
		// Users may edit the lan-address annotation (issue 38): a false
		// address on the LAN pod, one on a pod without a LAN interface.
		// The status reports from the node's own state (the plugin's
		// reports, the LAN pool's Leases), so neither shows.
		forged := map[string]string{"fixed": "net1=" + kubecluster.LANPrefix + "77/24", "plain": "net1=" + kubecluster.LANPrefix + "78/24"}
		for name, v := range forged {
			if out, err := c.Kubectl("-n", ok.ns, "annotate", "--overwrite", "pod", name, kubenames.AnnotationLANAddress+"="+v); err != nil {
				t.Fatalf("forging %s's annotation: %v\n%s", name, err, out)
			}
		}
		p := villagePods(t, c)[n1.Name]
		out, err := c.Kubectl("-n", kubecluster.VillageNamespace, "exec", p.Name, "-c", "agent", "--",
			"villaged", "status", "--conf", "/var/lib/village/staged/10-village.conflist", "--node-name", n1.Name)
		if !strings.Contains(string(out), "lan-ok/fixed\tnet1="+lanFixed+"/24") {
			t.Fatalf("villaged status on node-1 (%v):\n%s\nwant lan-ok/fixed net1=%s/24", err, out, lanFixed)
		}
		if strings.Contains(string(out), "lan-ok/plain") || strings.Contains(string(out), kubecluster.LANPrefix+"77") || strings.Contains(string(out), kubecluster.LANPrefix+"78") {
			t.Fatalf("villaged status on node-1 reports a forged annotation:\n%s", out)
		}
		// The listing read the LAN pool's Leases (through the host
		// credentials): a failed read is logged, and would leave only the
		// plugin's reports to list from.
		logs, err := c.Kubectl("-n", kubecluster.VillageNamespace, "logs", p.Name, "-c", "agent")
		if err != nil || strings.Contains(string(logs), "(listing what the plugin reported)") {
			t.Fatalf("the agent on node-1 could not read the LAN pool (%v):\n%s", err, logs)
		}
	})
	// The reboot with a LAN section: every ADD after it asks the agent,
	// which is not back yet (reboot_test.go).
	t.Run("Reboot", func(t *testing.T) {
		rb := newFixture(t, c, "lan-rb")
		labelNS(t, c, rb.ns, kubenames.LabelLANAllowed)
		checkRebootLAN(t, c, rb, func(f *fixture, name, nodeName string) { lanPod(f, name, nodeName, want) })
	})
	// Last: it installs the LAN config again, with macvlan.services.
	t.Run("Services", func(t *testing.T) { lanServices(t, c) })
}

// homeLab is one of deploy/kubernetes/examples/homelab's LAN ConfigMaps as
// applyHomeLab installs it.
type homeLab struct {
	file    string      // the ConfigMap's file in the example
	replace [][2]string // old, new: the example's LAN by the cluster's (each old must be there)
	then    []string    // kubectl arguments run after the apply (rolls the agents)
	// ready reports whether node n runs the agents on the new conflist.
	ready func(n *kubecluster.Node) error
}

// applyHomeLab writes h's ConfigMap with its replacements, applies it, runs
// h.then, and waits until the DaemonSet is ready and h.ready holds on every
// node. It returns the file it applied (the user's ConfigMap).
func applyHomeLab(t testing.TB, c *kubecluster.Cluster, h homeLab) string {
	t.Helper()
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "examples", "homelab", h.file))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, r := range h.replace {
		if !strings.Contains(s, r[0]) {
			t.Fatalf("the home-lab %s has no %s", h.file, r[0])
		}
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	f := filepath.Join(t.TempDir(), h.file)
	if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"apply", "-f", f}, h.then} {
		if out, err := c.Kubectl(args...); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	if err := c.WaitVillageReady(wait); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if err := kubecluster.Poll(wait, func() error { return h.ready(n) }); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// installLANConfig applies the home-lab example's ConfigMap with the
// cluster's LAN in place of the example's (and extra replacements),
// restarts the DaemonSet and waits until every node has the new conflist.
// It returns the file it applied.
func installLANConfig(t testing.TB, c *kubecluster.Cluster, extra ...[2]string) string {
	t.Helper()
	return applyHomeLab(t, c, homeLab{
		file: "configmap-lan.yaml",
		replace: append([][2]string{
			{`"rangeStart": "192.168.50.210"`, `"rangeStart": "` + lanFirst + `"`},
			{`"rangeEnd": "192.168.50.239"`, `"rangeEnd": "` + lanLast + `"`},
			{`"subnet": "192.168.50.0/24"`, `"subnet": "` + kubecluster.LANPrefix + `0/24"`},
			{`"gateway": "192.168.50.1"`, `"gateway": "` + kubecluster.LANIP + `"`},
		}, extra...),
		then: []string{"-n", kubecluster.VillageNamespace, "rollout", "restart", "daemonset/" + kubecluster.VillageDaemonSet},
		ready: func(n *kubecluster.Node) error {
			out, err := n.Exec("cat", "/etc/cni/net.d/10-village.conflist")
			if err != nil || !strings.Contains(string(out), `"annotated"`) {
				return fmt.Errorf("conflist on %s without the LAN section (%v)", n.Name, err)
			}
			out, err = n.Exec("cat", "/run/village/kube/kubeconfig")
			if err != nil || !strings.Contains(string(out), "tokenFile") {
				return fmt.Errorf("no host kubeconfig on %s (%v)", n.Name, err)
			}
			return nil
		},
	})
}

func labelNS(t testing.TB, c *kubecluster.Cluster, ns, value string) {
	t.Helper()
	if out, err := c.Kubectl("label", "namespace", ns, kubenames.LabelLAN+"="+value); err != nil {
		t.Fatalf("labelling %s: %v\n%s", ns, err, out)
	}
}

// lanAddress waits for the pod's village.cni.io/lan-address annotation.
func lanAddress(t *testing.T, f *fixture, name string) string {
	t.Helper()
	var v string
	if err := kubecluster.Poll(wait, func() error {
		p, err := f.c.Client().CoreV1().Pods(f.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v = p.Annotations[kubenames.AnnotationLANAddress]; v == "" {
			return fmt.Errorf("pod %s has no %s", name, kubenames.AnnotationLANAddress)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// waitEvent waits for a Warning Event on the pod with reason whose message
// names what, and returns it.
func waitEvent(t *testing.T, f *fixture, pod, reason, what string) corev1.Event {
	t.Helper()
	var seen []string
	var found corev1.Event
	if err := kubecluster.Poll(wait, func() error {
		evs, err := f.c.Client().CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return err
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == reason && strings.Contains(e.Message, what) && e.Type == corev1.EventTypeWarning {
				found = e
				return nil
			}
		}
		return fmt.Errorf("no %s Event naming %q", reason, what)
	}); err != nil {
		t.Fatalf("pod %s/%s: %v; Events: %q", f.ns, pod, err, seen)
	}
	return found
}

// deletePod deletes the pod and waits until it is gone.
func deletePod(t *testing.T, f *fixture, name string) {
	t.Helper()
	cs := f.c.Client().CoreV1().Pods(f.ns)
	if err := cs.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting %s: %v", name, err)
	}
	if err := kubecluster.Poll(wait, func() error {
		_, err := cs.Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod %s still there (%v)", name, err)
	}); err != nil {
		t.Fatal(err)
	}
}

// leaseHolds reports whether a Lease of the kubernetes store holds ip.
func leaseHolds(t *testing.T, c *kubecluster.Cluster, ip string) bool {
	t.Helper()
	ls, err := c.Client().CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls.Items {
		if l.Annotations["village.cni.io/ipam-ip"] == ip {
			return true
		}
	}
	return false
}

func must(t *testing.T, err error, format string, a ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf(format+": %v", append(a, err)...)
	}
}
