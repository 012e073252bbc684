package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// The kubernetes-registry scenario: the same namespace LAN as the etcd one,
// a real kube-apiserver (with its etcd) in the "LAN host" namespace, and
// three node namespaces each running the real `villaged run` with one
// identical conflist naming the registry type kubernetes. The test plays
// kube-controller-manager: it creates the Node objects with spec.podCIDRs.
// The agents authenticate as the DaemonSet's ServiceAccount, each with a
// token bound to a Pod on its Node (kubetest.AgentOn), bound only by
// deploy/kubernetes/rbac.yaml and confined by admission.yaml, so the shipped
// RBAC and policies are proven sufficient, and the agents find themselves
// confined (they write nothing until they are).

func kubeConflist(mode, dataDir, kubeconfig string) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"agt","plugins":[{"type":"village","bridge":"village0","isDefaultGateway":true,
		"ipMasq":true,"clusterCIDR":%q,
		"ipam":{"type":"village-ipam","dataDir":%q},
		"backend":{"type":%q,"underlay":"lan0","vni":9,
			"registry":{"type":"kubernetes","kubeconfig":%q}}}]}`,
		agentCluster, dataDir, mode, kubeconfig)
}

type kubeLab struct {
	*agentLab
	kube *kubetest.Server
}

func newKubeLab(t *testing.T, mode string) *kubeLab {
	t.Helper()
	return newKubeLabWith(t, mode, nil)
}

// newKubeLabWith is newKubeLab with the conflist passed through edit
// (nil: as it is).
func newKubeLabWith(t *testing.T, mode string, edit func(conf string, kube *kubetest.Server) string) *kubeLab {
	t.Helper()
	return newKubeLabOf(t, mode, 3, edit)
}

// newKubeLabOf is newKubeLabWith with count nodes on the LAN.
func newKubeLabOf(t *testing.T, mode string, count int, edit func(conf string, kube *kubetest.Server) string) *kubeLab {
	t.Helper()
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", agentEtcdIP+"/24")
	kube := kubetest.Start(t, kubetest.Options{NetNS: host, IP: agentEtcdIP})
	applyRBAC(t, kube)
	lab := &kubeLab{agentLab: &agentLab{t: t, host: host}, kube: kube}
	lab.setup(lan, func(dataDir string) string {
		conf := kubeConflist(mode, dataDir, kube.NodeAgentKubeconfig)
		if edit != nil {
			conf = edit(conf, kube)
		}
		return conf
	}, count)
	return lab
}

// applyRBAC creates the roles and bindings of deploy/kubernetes/rbac.yaml
// and the admission policies of admission.yaml.
func applyRBAC(t testing.TB, kube *kubetest.Server) {
	applyManifest(t, kube, filepath.Join("deploy", "kubernetes", "rbac.yaml"), nil)
	applyManifest(t, kube, filepath.Join("deploy", "kubernetes", "admission.yaml"), nil)
}

// applyManifest creates the objects of the module's file rel (RBAC and
// admission policies), each document first passed through edit (nil: as
// it is).
func applyManifest(t testing.TB, kube *kubetest.Server, rel string, edit func(doc []byte) []byte) {
	root, err := testenv.ModuleRoot()
	must(t, err, "module root")
	b, err := os.ReadFile(filepath.Join(root, rel))
	must(t, err, "reading %s", rel)
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	ctx := context.Background()
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		must(t, err, "reading %s", rel)
		if edit != nil {
			doc = edit(doc)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		must(t, err, "decoding %s", rel)
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			_, err = kube.Client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = kube.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = kube.Client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = kube.Client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = kube.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = kube.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", rel, obj)
		}
		must(t, err, "creating %T from %s", obj, rel)
	}
}

// createNode makes node n's Node object, with podCIDR when it is not ""
// (a comma list: one per family, as kube-controller-manager assigns them
// to a dual-stack node).
func (lab *kubeLab) createNode(n *agentNode, podCIDR string) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	if podCIDR != "" {
		cidrs := strings.Split(podCIDR, ",")
		node.Spec.PodCIDR, node.Spec.PodCIDRs = cidrs[0], cidrs
	}
	_, err := lab.kube.Client.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{})
	must(lab.t, err, "creating Node %s", n.name)
	n.env = []string{lab.kube.AgentOn(lab.t, n.name)}
}

func (lab *kubeLab) node(name string) *corev1.Node {
	n, err := lab.kube.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	must(lab.t, err, "reading Node %s", name)
	return n
}

// annotate sets one annotation of Node name and fails unless the API
// server's answer carries it (the value was applied).
func (lab *kubeLab) annotate(name, key, value string) {
	n := lab.patchMeta(name, "annotations", key, value)
	if got := n.Annotations[key]; got != value {
		lab.t.Fatalf("Node %s after the patch: %s=%q, want %q", name, key, got, value)
	}
}

// label sets one label of Node name, as annotate does an annotation.
func (lab *kubeLab) label(name, key, value string) {
	n := lab.patchMeta(name, "labels", key, value)
	if got := n.Labels[key]; got != value {
		lab.t.Fatalf("Node %s after the patch: label %s=%q, want %q", name, key, got, value)
	}
}

// patchMeta sets key to value in Node name's metadata field (labels or
// annotations) and returns the Node the API server answers with.
func (lab *kubeLab) patchMeta(name, field, key, value string) *corev1.Node {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{field: map[string]string{key: value}}})
	n, err := lab.kube.Client.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	must(lab.t, err, "setting %s %s of Node %s", field, key, name)
	return n
}

func TestAgentKubernetesCluster(t *testing.T) {
	for _, mode := range []string{"vxlan", "host-gw"} {
		t.Run(mode, func(t *testing.T) {
			lab := newKubeLab(t, mode)
			for i, n := range lab.nodes {
				lab.createNode(n, fmt.Sprintf("10.70.%d.0/24", i+1))
			}
			subnets := lab.startAll()
			for i, s := range subnets {
				if want := fmt.Sprintf("10.70.%d.0/24", i+1); s != want {
					t.Fatalf("node%d published %s, want its Node's podCIDR %s", i+1, s, want)
				}
				n := lab.node(lab.nodes[i].name)
				if n.Annotations[kubenames.AnnotationUnderlayIP] != lab.nodes[i].ip || n.Annotations[kubenames.AnnotationVtepMAC] == "" {
					t.Fatalf("Node %s annotations %v", n.Name, n.Annotations)
				}
			}
			pods := lab.podsPing(subnets)
			lab.statusClean()
			lab.annotationRepaired(subnets)
			lab.apiServerRestart(pods, subnets)
			subnets = lab.lateNode(subnets)
			lab.deletedNode(subnets)
		})
	}
}

// statusClean: `villaged status` reads the same registry (one list of
// Nodes) and finds node1 registered and in sync.
func (lab *kubeLab) statusClean() {
	t := lab.t
	n1 := lab.nodes[0]
	waitFor(t, 30*time.Second, "villaged status on node1 is clean", func() (bool, string) {
		out, err := n1.villaged(t, "status", "--conf", lab.conf, "--node-name", n1.name, "--run-dir", n1.runDir).CombinedOutput()
		return err == nil && strings.Contains(string(out), `Node "node1": registered`) && strings.Contains(string(out), "status: in sync"), string(out)
	})
}

// annotationRepaired: node2's underlay-ip annotation changed by hand is
// written back by node2's agent, and the cluster routes to node2 again.
func (lab *kubeLab) annotationRepaired(subnets []string) {
	t := lab.t
	n2 := lab.nodes[1]
	// The bad value is applied (annotate checks the API server's answer),
	// and node2's agent writes its own back: its log says so once more.
	wrote := strings.Count(n2.log.String(), "annotated Node")
	lab.annotate(n2.name, kubenames.AnnotationUnderlayIP, "192.168.79.99")
	waitFor(t, 2*time.Minute, "node2's agent restores its annotation", func() (bool, string) {
		n := lab.node(n2.name)
		return n.Annotations[kubenames.AnnotationUnderlayIP] == n2.ip && strings.Count(n2.log.String(), "annotated Node") > wrote,
			fmt.Sprint(n.Annotations) + "\n" + n2.log.String()
	})
	n1 := lab.nodes[0]
	waitFor(t, 2*time.Minute, "node1 routes to node2 through node2's real address", func() (bool, string) {
		r := n1.routes(t)
		for _, l := range strings.Split(r, "\n") {
			if strings.HasPrefix(l, subnets[1]+" ") {
				return !strings.Contains(r, "192.168.79.99"), r
			}
		}
		return false, r
	})
}

// datapath is every node's Village routes, permanent neighbours, FDB
// entries and VXLAN device, each node's lines sorted (dump order is the
// kernel's hash order, not state).
func (lab *kubeLab) datapath() string {
	var b strings.Builder
	for _, n := range lab.nodes {
		r, _ := testenv.IP(n.NS, "route", "show", "proto", "86")
		ne, _ := testenv.IP(n.NS, "neigh", "show", "nud", "permanent")
		dev, _ := testenv.IP(n.NS, "-d", "link", "show", "type", "vxlan")
		fdb, _ := exec.Command("ip", "netns", "exec", n.Name(), "bridge", "fdb", "show", "dev", "village.9").CombinedOutput()
		var lines []string
		for _, l := range strings.Split(r+ne+dev+string(fdb), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		slices.Sort(lines)
		fmt.Fprintf(&b, "== %s\n%s\n", n.name, strings.Join(lines, "\n"))
	}
	return b.String()
}

// apiServerRestart: with the API server stopped the datapath stays and
// pods keep talking; when it is back the agents resume (a change made
// after the restart reaches them: lateNode).
func (lab *kubeLab) apiServerRestart(pods []*Pod, subnets []string) {
	t := lab.t
	before := lab.datapath()
	lab.kube.StopAPIServer()
	// The informers notice the broken watch: no agent holds a connection
	// to the API server any more (none established, none half-closed).
	lab.waitAPIConns(false)
	to := podIPv4(t, pods[1])
	must(t, testenv.Ping(pods[0].NS, to, 2), "pod on node1 -> pod on node2 with the API server down")
	for i, n := range lab.nodes {
		others := append(append([]string{}, subnets[:i]...), subnets[i+1:]...)
		if ok, r := n.hasRoutes(t, others, nil); !ok {
			t.Fatalf("%s lost routes while the API server was down: %s", n.name, r)
		}
	}
	lab.kube.StartAPIServer()
	// Every agent is connected again and has made a reconcile pass since.
	lab.waitAPIConns(true)
	for _, n := range lab.nodes {
		waitReconcileRuns(t, n.NS, reconcileRuns(t, n.NS)+1)
	}
	if after := lab.datapath(); after != before {
		t.Fatalf("the datapath changed across an API server restart:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	for _, n := range lab.nodes {
		if n.cmd == nil {
			t.Fatalf("agent on %s is not running", n.name)
		}
		select {
		case err := <-n.exited:
			t.Fatalf("agent on %s exited across the API server restart: %v", n.name, err)
		default:
		}
	}
}

// waitAPIConns waits until every agent's namespace holds a TCP connection
// to the API server (connected) or none established or half-closed
// (!connected); 120 s only guards against a hang.
func (lab *kubeLab) waitAPIConns(connected bool) {
	t := lab.t
	u, err := url.Parse(lab.kube.URL)
	must(t, err, "API server URL")
	for _, n := range lab.nodes {
		waitFor(t, 2*time.Minute, fmt.Sprintf("%s connected to the API server: %v", n.name, connected), func() (bool, string) {
			out, err := exec.Command("ip", "netns", "exec", n.Name(), "ss", "-Htn", "state", "established", "state", "close-wait",
				"dst", u.Host).CombinedOutput()
			if err != nil {
				return false, fmt.Sprintf("ss: %v: %s", err, out)
			}
			return (strings.TrimSpace(string(out)) != "") == connected, string(out)
		})
	}
}

// lateNode: node4 joins after the others; its Node has no podCIDR at
// first, so its agent says so and waits (no crash); once the podCIDR is set
// it publishes it, and node4's pod reaches node1's pod both ways.
func (lab *kubeLab) lateNode(subnets []string) []string {
	t := lab.t
	n4 := lab.addNode()
	lab.createNode(n4, "")
	lab.start(n4)
	waitFor(t, 30*time.Second, "node4's agent reports the missing podCIDR", func() (bool, string) {
		return strings.Contains(n4.log.String(), "no spec.podCIDRs yet"), n4.log.String()
	})
	select {
	case err := <-n4.exited:
		t.Fatalf("node4's agent exited without a podCIDR: %v\n%s", err, n4.log.String())
	default:
	}
	// Dual stack, as kube-controller-manager assigns it: one per family.
	patch := []byte(`{"spec":{"podCIDR":"10.70.4.0/24","podCIDRs":["10.70.4.0/24","fd70:4::/64"]}}`)
	_, err := lab.kube.Client.CoreV1().Nodes().Patch(context.Background(), n4.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	must(t, err, "setting node4's podCIDR")
	waitFor(t, 30*time.Second, "node4 publishes both its podCIDRs", func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join(n4.runDir, "agt", "subnet"))
		return strings.HasSuffix(string(b), "\n10.70.4.0/24\nfd70:4::/64\n"), string(b) + n4.log.String()
	})
	subnets = append(subnets, "10.70.4.0/24")
	for i, n := range lab.nodes {
		others := append(append([]string{}, subnets[:i]...), subnets[i+1:]...)
		waitFor(t, 30*time.Second, n.name+" routes to every other node", func() (bool, string) {
			return n.hasRoutes(t, others, nil)
		})
	}
	p4, p1 := n4.NewPod(), lab.nodes[0].NewPod()
	a4 := n4.MustAdd(lab.list, p4).IPs[0].Address.IP.String()
	a1 := lab.nodes[0].MustAdd(lab.list, p1).IPs[0].Address.IP.String()
	must(t, testenv.Ping(p4.NS, a1, 2), "pod on node4 -> pod on node1")
	must(t, testenv.Ping(p1.NS, a4, 2), "pod on node1 -> pod on node4")
	return subnets
}

// deletedNode: node4's Node deleted (its agent stopped first, as when a
// machine is removed) takes its routes off every other node.
func (lab *kubeLab) deletedNode(subnets []string) {
	t := lab.t
	n4 := lab.nodes[3]
	_ = n4.stop(t, syscall.SIGTERM)
	err := lab.kube.Client.CoreV1().Nodes().Delete(context.Background(), n4.name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting Node %s: %v", n4.name, err)
	}
	for _, n := range lab.nodes[:3] {
		waitFor(t, 30*time.Second, n.name+" drops the deleted Node's routes", func() (bool, string) {
			return n.hasRoutes(t, nil, []string{subnets[3]})
		})
	}
	if ok, r := lab.nodes[0].hasRoutes(t, subnets[1:3], nil); !ok {
		t.Fatalf("node1 lost routes to node2/node3: %s", r)
	}
}

// podIPv4 is the IPv4 address of p's eth0.
func podIPv4(t *testing.T, p *Pod) string { return podAddr(t, p, "-4", "inet") }

// podIPv6 is the pod's global IPv6 address on eth0.
func podIPv6(t *testing.T, p *Pod) string { return podAddr(t, p, "-6", "inet6") }

func podAddr(t *testing.T, p *Pod, family, word string) string {
	t.Helper()
	out := testenv.MustIP(t, p.NS, family, "-o", "addr", "show", "dev", "eth0", "scope", "global")
	f := strings.Fields(out)
	for i := range f {
		if f[i] == word && i+1 < len(f) {
			return strings.Split(f[i+1], "/")[0]
		}
	}
	t.Fatalf("no %s address on the pod's eth0: %s", word, out)
	return ""
}
