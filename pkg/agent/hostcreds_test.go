package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	ktesting "k8s.io/client-go/testing"

	ipamconfig "github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/nodelocal"
)

// TestHostCredsBoundToNode: the LAN pool's host token is requested for
// village-ipam bound to this node's Node object for an hour, and written
// with its kubeconfig; without the Node no token is requested at all.
func TestHostCredsBoundToNode(t *testing.T) {
	c := &Conf{Node: "node-1", Net: &netconf.NetConf{LAN: &netconf.LAN{IPAM: []byte(`{"type":"village-ipam","store":{"type":"kubernetes"}}`)}},
		LANStore: &ipamconfig.StoreConfig{Type: ipamconfig.StoreKubernetes}}
	rc := &rest.Config{Host: "https://192.0.2.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca")}}
	var mu sync.Mutex
	var got []*authv1.TokenRequest
	var accounts []string
	cs := fake.NewSimpleClientset()
	cs.PrependReactor("create", "serviceaccounts", func(a ktesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := a.(ktesting.CreateAction).GetObject().(*authv1.TokenRequest)
		mu.Lock()
		got = append(got, tr.DeepCopy())
		accounts = append(accounts, a.(ktesting.CreateActionImpl).Name)
		mu.Unlock()
		out := tr.DeepCopy()
		out.Status.Token = "minted"
		return true, out, nil
	})
	var stop func() // the last start's: stops its writer and waits
	start := func(t *testing.T) (dir string, err error) {
		// The directory first: cleanups run last-registered first, so the
		// writer is stopped (it may be writing the kubeconfig after the
		// token the test waited for) before the directory is removed.
		dir = t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		stop = func() { cancel(); wg.Wait() }
		t.Cleanup(stop)
		return dir, startHostCreds(ctx, &wg, c, rc, cs, dir, t.Logf)
	}

	t.Run("NoNode", func(t *testing.T) {
		dir, err := start(t)
		if err != nil {
			t.Fatal(err)
		}
		// The agent retries every 10 s: the first attempt has failed once
		// the Node was asked for.
		deadline := time.Now().Add(time.Minute)
		for !slices.ContainsFunc(cs.Actions(), func(a ktesting.Action) bool { return a.GetVerb() == "get" && a.GetResource().Resource == "nodes" }) {
			if time.Now().After(deadline) {
				t.Fatal("the Node was never read")
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 0 {
			t.Fatalf("requested %d tokens without the Node to bind them to", len(got))
		}
		if _, err := os.Stat(filepath.Join(nodelocal.HostCredsDir(dir), "token")); err == nil {
			t.Fatal("a token was written")
		}
	})
	t.Run("Bound", func(t *testing.T) {
		if _, err := cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "0b5d-uid"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		dir, err := start(t)
		if err != nil {
			t.Fatal(err)
		}
		token := filepath.Join(nodelocal.HostCredsDir(dir), "token")
		deadline := time.Now().Add(time.Minute)
		for {
			if b, err := os.ReadFile(token); err == nil && string(b) == "minted" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no token written in %s", token)
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		tr := got[0]
		ref := tr.Spec.BoundObjectRef
		if accounts[0] != HostCredsAccount {
			t.Errorf("token of ServiceAccount %q, want %q", accounts[0], HostCredsAccount)
		}
		if ref == nil || ref.Kind != "Node" || ref.APIVersion != "v1" || ref.Name != "node-1" || ref.UID != "0b5d-uid" {
			t.Errorf("token bound to %+v, want Node node-1 (uid 0b5d-uid)", ref)
		}
		if tr.Spec.ExpirationSeconds == nil || *tr.Spec.ExpirationSeconds != 3600 {
			t.Errorf("token life %v, want 3600 s", tr.Spec.ExpirationSeconds)
		}
		// The agent stops (SIGTERM cancels run's context): the token and
		// the kubeconfig naming it are gone from the host.
		mu.Unlock()
		stop()
		mu.Lock()
		for _, f := range []string{token, nodelocal.HostKubeconfig(dir)} {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				t.Errorf("%s after the agent stopped: %v, want it removed", f, err)
			}
		}
	})
}
