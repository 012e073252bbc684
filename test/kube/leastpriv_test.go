package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/village-cni/village/internal/kubecluster"
	kubestore "github.com/village-cni/village/pkg/ipam/store/kube"
	"github.com/village-cni/village/pkg/kubenames"
)

// checkLeastPrivilege: the agent's identity as the DaemonSet gives it (the
// projected token the kubelet wrote for node-1's Village pod, read from the
// node's disk) can change only node-1's Node and node-1's pods, and there
// only village.cni.io/ annotations; it cannot read Secrets nor touch another
// component's Lease; the tokens it can mint are bound to an object and can write
// only the LAN pool's Leases. Each refusal comes from the API server (RBAC
// or deploy/kubernetes/admission.yaml), and is logged with its status. The
// agent's own writes still work.
func checkLeastPrivilege(t *testing.T, c *kubecluster.Cluster) {
	ctx := context.Background()
	admin := c.Client()
	f := newFixture(t, c, "leastpriv")
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")
	f.server("own", n1.Name)
	f.server("other", n2.Name)
	f.running("own", "other")

	agentPod, ok := villagePods(t, c)[n1.Name]
	if !ok {
		t.Fatalf("no Village pod on %s", n1.Name)
	}
	agent := agentClient(t, c, n1, &agentPod)
	n1Node, err := admin.CoreV1().Nodes().Get(ctx, n1.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n1UID := n1Node.UID

	// The leader Leases of kube-scheduler and kube-controller-manager (this
	// cluster runs them without leader election, so they may not exist:
	// made here, as a real cluster has them).
	for _, name := range []string{"kube-scheduler", "kube-controller-manager"} {
		l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}, Spec: coordv1.LeaseSpec{HolderIdentity: ptr("leader")}}
		if _, err := admin.CoordinationV1().Leases("kube-system").Create(ctx, l, metav1.CreateOptions{}); err == nil {
			t.Cleanup(func() {
				_ = admin.CoordinationV1().Leases("kube-system").Delete(context.Background(), name, metav1.DeleteOptions{})
			})
		} else if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("Lease kube-system/%s: %v", name, err)
		}
	}

	ann := func(key, value string) []byte {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}})
		return b
	}
	villageKey := kubenames.Prefix + "leastpriv-test"
	merge := types.MergePatchType
	nodePatch := func(cs kubernetes.Interface, name string, patch []byte, sub ...string) func() error {
		return func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, name, merge, patch, metav1.PatchOptions{}, sub...)
			return err
		}
	}
	podPatch := func(cs kubernetes.Interface, name string, pt types.PatchType, patch []byte) func() error {
		return func() error {
			_, err := cs.CoreV1().Pods(f.ns).Patch(ctx, name, pt, patch, metav1.PatchOptions{})
			return err
		}
	}
	leaseWrites := func(cs kubernetes.Interface, who string) []refusal {
		var out []refusal
		for _, name := range []string{"kube-scheduler", "kube-controller-manager"} {
			leases := cs.CoordinationV1().Leases("kube-system")
			out = append(out,
				refusal{who + " creates Lease kube-system/" + name, func() error {
					_, err := leases.Create(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}}, metav1.CreateOptions{})
					return err
				}},
				refusal{who + " updates Lease kube-system/" + name, func() error {
					l, err := admin.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						return fmt.Errorf("admin: %w", err) // not a refusal: fails the test
					}
					l.Spec.HolderIdentity = ptr("village")
					_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
					return err
				}},
				refusal{who + " deletes Lease kube-system/" + name, func() error {
					return leases.Delete(ctx, name, metav1.DeleteOptions{})
				}},
			)
		}
		return out
	}
	secrets := func(cs kubernetes.Interface, who string) []refusal {
		return []refusal{
			{who + " lists Secrets in kube-system", func() error {
				_, err := cs.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
				return err
			}},
			{who + " lists Secrets cluster-wide", func() error {
				_, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
				return err
			}},
		}
	}
	mint := func(account string, bound bool, life int64) func() (string, error) {
		return func() (string, error) {
			spec := authv1.TokenRequestSpec{ExpirationSeconds: &life}
			if bound { // as pkg/agent hostcreds does
				spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: n1.Name, UID: n1UID}
			}
			tr, err := agent.CoreV1().ServiceAccounts(kubecluster.VillageNamespace).CreateToken(ctx, account, &authv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				return "", err
			}
			return tr.Status.Token, nil
		}
	}
	mintErr := func(m func() (string, error)) func() error {
		return func() error { _, err := m(); return err }
	}

	t.Run("AgentRefused", func(t *testing.T) {
		rs := []refusal{
			{"annotating another Node (nodes/status)", nodePatch(agent, n2.Name, ann(villageKey, "x"), "status")},
			{"annotating another Node (nodes)", nodePatch(agent, n2.Name, ann(villageKey, "x"))},
			{"changing another Node's underlay-ip", nodePatch(agent, n2.Name, ann(kubenames.Prefix+"underlay-ip", "192.0.2.99"), "status")},
			{"tainting its own Node", nodePatch(agent, n1.Name, []byte(`{"spec":{"taints":[{"key":"x","effect":"NoSchedule"}]}}`))},
			{"labelling its own Node (nodes/status)", nodePatch(agent, n1.Name, []byte(`{"metadata":{"labels":{"x":"y"}}}`), "status")},
			{"a foreign annotation on its own Node", nodePatch(agent, n1.Name, ann("example.com/x", "y"), "status")},
			{"changing its own Node's status", nodePatch(agent, n1.Name, []byte(`{"status":{"capacity":{"example.com/leastpriv":"1"}}}`), "status")},
			{"annotating a pod on another node", podPatch(agent, "other", merge, ann(villageKey, "x"))},
			{"changing a pod's image", podPatch(agent, "own", types.StrategicMergePatchType,
				[]byte(`{"spec":{"containers":[{"name":"main","image":"registry.example/evil:1"}]}}`))},
			{"labelling a pod", podPatch(agent, "own", merge, []byte(`{"metadata":{"labels":{"app":"other"}}}`))},
			{"a foreign annotation on its own node's pod", podPatch(agent, "own", merge, ann("example.com/x", "y"))},
			{"deleting a pod", func() error { return agent.CoreV1().Pods(f.ns).Delete(ctx, "own", metav1.DeleteOptions{}) }},
			{"minting a token of its own ServiceAccount", mintErr(mint("village", true, 3600))},
			{"minting a token of another ServiceAccount", mintErr(mint("default", true, 3600))},
			{"minting a village-ipam token bound to nothing", mintErr(mint("village-ipam", false, 3600))},
			{"minting a village-ipam token for a day", mintErr(mint("village-ipam", true, 86400))},
		}
		rs = append(rs, leaseWrites(agent, "the agent")...)
		rs = append(rs, secrets(agent, "the agent")...)
		checkRefused(t, rs)
	})

	t.Run("MintedTokenRefused", func(t *testing.T) {
		tok, err := mint("village-ipam", true, 3600)()
		if err != nil {
			t.Fatalf("the agent cannot mint its Node-bound village-ipam token (what pkg/agent hostcreds does): %v", err)
		}
		ipam := tokenClient(t, c, tok)
		rs := []refusal{
			{"annotating a Node", nodePatch(ipam, n1.Name, ann(villageKey, "x"), "status")},
			{"annotating a pod", podPatch(ipam, "own", merge, ann(villageKey, "x"))},
			{"labelling a pod", podPatch(ipam, "own", merge, []byte(`{"metadata":{"labels":{"app":"other"}}}`))},
			{"minting a token", func() error {
				life := int64(3600)
				_, err := ipam.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "village-ipam", &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &life}}, metav1.CreateOptions{})
				return err
			}},
		}
		rs = append(rs, leaseWrites(ipam, "village-ipam")...)
		rs = append(rs, secrets(ipam, "village-ipam")...)
		checkRefused(t, rs)
		// What the token is for: a Lease of the pool, written and removed.
		name := kubestore.LeasePrefix + "leastpriv-test"
		leases := ipam.CoordinationV1().Leases("kube-system")
		// An address's Lease names its node (holder, annotation), as
		// pkg/ipam/store/kube writes it: admission.yaml's village-ipam
		// wants the node of the token (bound to node-1's Node).
		own := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kubenames.LabelIPAMKind: "address"},
			Annotations: map[string]string{kubenames.AnnotationIPAMNode: n1.Name}}, Spec: coordv1.LeaseSpec{HolderIdentity: ptr(n1.Name)}}
		if _, err := leases.Create(ctx, own, metav1.CreateOptions{}); err != nil {
			t.Fatalf("village-ipam creating its own Lease %s: %v", name, err)
		}
		if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("village-ipam deleting its own Lease %s: %v", name, err)
		}
	})

	t.Run("AgentWritesItsOwn", func(t *testing.T) {
		// Its own Node's annotation, through nodes/status (pkg/kuberegistry),
		// kept by the API server.
		if err := nodePatch(agent, n1.Name, ann(villageKey, "mine"), "status")(); err != nil {
			t.Fatalf("the agent annotating its own Node through nodes/status: %v", err)
		}
		nd, err := admin.CoreV1().Nodes().Get(ctx, n1.Name, metav1.GetOptions{})
		if err != nil || nd.Annotations[villageKey] != "mine" {
			t.Fatalf("Node %s after the agent's status patch: annotation %q (%v), want %q", n1.Name, nd.Annotations[villageKey], err, "mine")
		}
		if err := nodePatch(agent, n1.Name, []byte(`{"metadata":{"annotations":{"`+villageKey+`":null}}}`), "status")(); err != nil {
			t.Fatalf("the agent removing its own Node's annotation: %v", err)
		}
		// The annotations the running agent published are in place.
		if nd.Annotations[kubenames.Prefix+"underlay-ip"] != n1.IP {
			t.Errorf("Node %s: underlay-ip %q, want %s (published by the agent through nodes/status)", n1.Name, nd.Annotations[kubenames.Prefix+"underlay-ip"], n1.IP)
		}
		// A Village annotation on a pod bound to its node (lan-address).
		if err := podPatch(agent, "own", merge, ann(villageKey, "mine"))(); err != nil {
			t.Fatalf("the agent annotating pod own on its node: %v", err)
		}
		p, err := admin.CoreV1().Pods(f.ns).Get(ctx, "own", metav1.GetOptions{})
		if err != nil || p.Annotations[villageKey] != "mine" {
			t.Fatalf("pod own: annotation %q (%v), want %q", p.Annotations[villageKey], err, "mine")
		}
	})
}

// refusal is a request the identity under test must be refused.
type refusal struct {
	what string
	do   func() error
}

// checkRefused runs each request and wants a Forbidden or Invalid answer
// from the API server; it logs each answer's code, reason and message.
func checkRefused(t *testing.T, rs []refusal) {
	t.Helper()
	for _, r := range rs {
		err := r.do()
		var st apierrors.APIStatus
		switch {
		case err == nil:
			t.Errorf("%s: ALLOWED", r.what)
		case !(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) || !errors.As(err, &st):
			t.Errorf("%s: not refused by the API server but %v", r.what, err)
		default:
			s := st.Status()
			t.Logf("refused: %s: %d %s: %s", r.what, s.Code, s.Reason, s.Message)
		}
	}
}

// agentClient is a client with the token the kubelet projected into the
// agent pod p on node n (the DaemonSet's kube-api-access volume), read from
// the node's disk as the agent's container sees it.
func agentClient(t *testing.T, c *kubecluster.Cluster, n *kubecluster.Node, p *corev1.Pod) kubernetes.Interface {
	t.Helper()
	out, err := n.Exec("sh", "-c", "cat /var/lib/kubelet/pods/"+string(p.UID)+"/volumes/kubernetes.io~projected/kube-api-access-*/token")
	tok := strings.TrimSpace(string(out))
	if err != nil || strings.Count(tok, ".") != 2 {
		t.Fatalf("the agent's projected token on %s: %v (%q)", n.Name, err, tok)
	}
	return tokenClient(t, c, tok)
}

// tokenClient is a client of c's API server authenticated only by token.
func tokenClient(t *testing.T, c *kubecluster.Cluster, token string) kubernetes.Interface {
	t.Helper()
	rc := rest.AnonymousClientConfig(c.API().Config)
	rc.BearerToken = token
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func ptr[T any](v T) *T { return &v }
