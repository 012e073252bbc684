package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CredentialEnv names the file NodeAgentKubeconfig's credential plugin
// reads: each node's agent process gets its own, so one conflist (one
// kubeconfig path) serves every node of a lab, as one DaemonSet spec does.
const CredentialEnv = "VILLAGE_TEST_CREDENTIAL"

// AgentOn gives the agent of node the identity the DaemonSet's pod on that
// node has in a real cluster: the ServiceAccount kube-system/village, a
// Pod of it bound to node (no kubelet runs it), and a token bound to that
// Pod (host network, as the DaemonSet's). The API server stamps such a token with the node's name (the extra
// authentication.kubernetes.io/node-name), the claim the policies of
// deploy/kubernetes/admission.yaml confine the agent by; the static agent
// token (AgentKubeconfig) names no node. The Node object must exist. It
// returns the environment entry for the agent's process, to be used with
// NodeAgentKubeconfig.
func (s *Server) AgentOn(t testing.TB, node string) string {
	t.Helper()
	ctx := context.Background()
	const ns, sa = "kube-system", "village"
	_, err := s.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: ServiceAccount %s/%s: %v", ns, sa, err)
	}
	name := "village-agent-" + node
	pod, err := s.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = s.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: new(bool), HostNetwork: true,
				Containers: []corev1.Container{{Name: "villaged", Image: "village"}}},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("kubetest: the agent's Pod %s/%s on Node %s: %v", ns, name, node, err)
	}
	life := int64(24 * 3600)
	tr, err := s.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &life,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: a token of %s/%s bound to Pod %s: %v", ns, sa, pod.Name, err)
	}
	// Prove the claim the policies need is there, or every write of the
	// agent would be refused for a reason far from here.
	rev, err := s.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: reviewing the agent token of Node %s: %v", node, err)
	}
	if got := rev.Status.User.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != node {
		t.Fatalf("kubetest: the agent token bound to Pod %s names node %v, want %s (authenticated %v, %s)", pod.Name, got, node, rev.Status.Authenticated, rev.Status.Error)
	}
	cred, err := json.Marshal(map[string]any{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
		"status": map[string]any{"token": tr.Status.Token}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(s.dir, "agent-"+node+".credential")
	if err := os.WriteFile(file, cred, 0o600); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return CredentialEnv + "=" + file
}

// nodeAgentKubeconfig is a kubeconfig whose user is a client-go credential
// plugin printing the file $VILLAGE_TEST_CREDENTIAL names (AgentOn).
func nodeAgentKubeconfig(server string, ca []byte) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: node-agent
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/sh
      args: ["-c", 'exec cat "$%s"']
      interactiveMode: Never
contexts:
- name: kubetest
  context: {cluster: kubetest, user: node-agent}
current-context: kubetest
`, server, b64(ca), CredentialEnv)
}
