package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/nodelocal"
)

// The host-side credentials of a LAN pool kept in the Kubernetes API
// ("store": {"type": "kubernetes"}): village-ipam-kube runs on the host,
// outside any pod, so it has no service-account token of its own. The agent
// requests one for the ServiceAccount HostCredsAccount (whose RBAC grants
// only the pool's Leases and reading Nodes, deploy/kubernetes/rbac.yaml, and
// whose Lease writes admission.yaml confines to the pool's names), bound to
// this node's Node object, writes it with the cluster's CA and a kubeconfig
// naming both under <run dir>/kube/ (nodelocal.HostCredsDir), and requests
// a new one well before it expires. The kubeconfig
// (nodelocal.HostKubeconfig) is what the LAN IPAM block's "kubeconfig"
// names, or means when it names none.
const (
	HostCredsAccount = "village-ipam"
	// hostTokenLife is the lifetime asked for; a new token is requested
	// after a third of it (so a token on disk is always valid for 40 min).
	hostTokenLife  = time.Hour
	hostCredsRetry = 10 * time.Second
)

// startHostCreds keeps the host credentials fresh while ctx lasts, when
// the LAN pool's store is the kubernetes one.
func startHostCreds(ctx context.Context, wg *sync.WaitGroup, c *Conf, rc *rest.Config, cs kubernetes.Interface, runDir string, logf func(string, ...any)) error {
	if st := c.LANStore; st == nil || st.Type != ipamconfig.StoreKubernetes {
		return nil
	}
	ca := rc.CAData
	if len(ca) == 0 && rc.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(rc.CAFile); err != nil {
			return fmt.Errorf("reading the cluster CA: %w", err)
		}
	}
	dir := nodelocal.HostCredsDir(runDir)
	ns := inClusterNamespace()
	wg.Go(func() {
		// A token outlives nothing it was minted for: gone with the agent
		// (SIGTERM, uninstall), so no credential is left on the host for
		// a node whose agent is not running. A new agent writes anew.
		defer func() {
			if err := os.RemoveAll(dir); err != nil {
				logf("removing the host credentials %s: %v", dir, err)
			}
		}()
		for {
			next := hostCredsRetry
			if err := writeHostCreds(ctx, cs, ns, c.Node, dir, rc.Host, ca); err != nil {
				if ctx.Err() != nil {
					return
				}
				logf("host credentials for the LAN pool (ServiceAccount %s/%s): %v (retrying in %s)", ns, HostCredsAccount, err, next)
			} else {
				next = hostTokenLife / 3
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(next):
			}
		}
	})
	return nil
}

// writeHostCreds requests the token bound to Node node. The API server
// binds a token to a Pod only when the Pod runs as the token's
// ServiceAccount, and the agent's Pod runs as village, not village-ipam;
// bound to the Node the token stops working when the Node is deleted (and
// after an hour anyway).
func writeHostCreds(ctx context.Context, cs kubernetes.Interface, ns, node, dir, server string, ca []byte) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading Node %q to bind the token to: %w", node, err)
	}
	life := int64(hostTokenLife / time.Second)
	ref := &authv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.UID}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, HostCredsAccount,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &life, BoundObjectRef: ref}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	token, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: village
  cluster:
    server: %q
    certificate-authority: %q
users:
- name: %s
  user:
    tokenFile: %q
contexts:
- name: village
  context: {cluster: village, user: %s}
current-context: village
`, server, caFile, HostCredsAccount, token, HostCredsAccount)
	for _, f := range []struct {
		path string
		data []byte
	}{{caFile, ca}, {token, []byte(tr.Status.Token)}, {nodelocal.HostKubeconfig(filepath.Dir(dir)), []byte(kc)}} {
		if err := nodelocal.WriteFile(f.path, f.data, 0o600); err != nil {
			return err
		}
	}
	return nil
}
