package kuberegistry

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/village-cni/village/internal/kubetest"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/registry"
)

// feedLab is one API server, its Nodes, and a Run of the registry feeding a
// reader that applies each batch to its node list, as the agent does.
type feedLab struct {
	t     *testing.T
	kube  *kubetest.Server
	reg   *Registry
	feed  *registry.Feed
	mu    sync.Mutex
	view  map[string]registry.Node
	fulls int // full batches taken
}

func peerNode(name, ip, cidr string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kubenames.AnnotationUnderlayIP: ip}},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}
}

func newFeedLab(t *testing.T, kube *kubetest.Server, self string, resync time.Duration, drop func(string) bool) *feedLab {
	lab := &feedLab{t: t, kube: kube, feed: registry.NewFeed(), view: map[string]registry.Node{}}
	if _, err := kube.Client.CoreV1().Nodes().Create(context.Background(), peerNode(self, "192.168.200.1", "10.200.0.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lab.reg = NewForClient(kube.Client, Config{Node: self, Resync: resync}, kube.URL)
	lab.reg.drop = drop
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	first := registry.Node{Name: self, IP: "192.168.200.1", PodCIDRs: []string{"10.200.0.0/24"}, VtepMAC: "0e:76:c0:a8:c8:01"}
	wg.Go(func() { lab.reg.Run(ctx, first, nil, lab.feed, t.Logf) })
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-lab.feed.Ready():
			}
			b, ok := lab.feed.Take()
			if !ok {
				continue
			}
			lab.mu.Lock()
			b.ApplyTo(lab.view)
			if b.Full {
				lab.fulls++
			}
			lab.mu.Unlock()
		}
	})
	return lab
}

// converged waits until the reader's list is the API server's (one List),
// and returns how many full batches it took.
func (lab *feedLab) converged(what string) int {
	lab.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		want, _, _, err := lab.reg.Nodes(context.Background())
		if err != nil {
			lab.t.Fatal(err)
		}
		lab.mu.Lock()
		got := slices.SortedFunc(maps.Values(lab.view), func(a, b registry.Node) int { return strings.Compare(a.Name, b.Name) })
		fulls := lab.fulls
		lab.mu.Unlock()
		if slices.EqualFunc(got, want, registry.Node.Equal) && len(want) > 0 {
			return fulls
		}
		if time.Now().After(deadline) {
			lab.t.Fatalf("%s: the fed list never matched the API server's:\nfed  %v\nwant %v", what, got, want)
		}
		time.Sleep(50 * time.Millisecond) // polling the condition itself
	}
}

func (lab *feedLab) patch(name string, ann map[string]any) {
	lab.t.Helper()
	p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if _, err := lab.kube.Client.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
		lab.t.Fatal(err)
	}
}

func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		})
	}
	wg.Wait()
}

func TestFeedAgainstAPIServer(t *testing.T) {
	kube := kubetest.Start(t, kubetest.Options{})
	t.Run("ChangesAloneConverge", func(t *testing.T) { changesAloneConverge(t, kube) })
	t.Run("LostAndReorderedRepairedByResync", func(t *testing.T) { lostRepaired(t, kube) })
}

// Many Nodes created, changed, turned into non-peers and deleted, in
// parallel: the reader's list ends exactly the API server's, from the first
// full batch and then changes only (no resync runs: it is an hour away).
func changesAloneConverge(t *testing.T, kube *kubetest.Server) {
	ctx := context.Background()
	api := kube.Client.CoreV1().Nodes()
	const n = 300
	name := func(i int) string { return fmt.Sprintf("c%03d", i) }
	// Half the Nodes exist before the registry starts (its first list),
	// half are created after.
	parallel(n/2, func(i int) {
		if _, err := api.Create(ctx, peerNode(name(i), fmt.Sprintf("192.168.10.%d", i%250+1), fmt.Sprintf("10.%d.%d.0/24", 10+i/256, i%256)), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	})
	lab := newFeedLab(t, kube, "c-self", time.Hour, nil)
	if lab.converged("first list") != 1 {
		t.Fatal("the first list did not come as one full batch")
	}
	parallel(n-n/2, func(i int) {
		i += n / 2
		if _, err := api.Create(ctx, peerNode(name(i), fmt.Sprintf("192.168.11.%d", i%250+1), fmt.Sprintf("10.%d.%d.0/24", 10+i/256, i%256)), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	})
	parallel(n, func(i int) {
		switch i % 6 {
		case 0, 1: // a new underlay address and MAC
			lab.patch(name(i), map[string]any{kubenames.AnnotationUnderlayIP: fmt.Sprintf("192.168.12.%d", i%250+1), kubenames.AnnotationVtepMAC: "0e:76:c0:a8:0c:01"})
		case 2: // no longer a peer
			lab.patch(name(i), map[string]any{kubenames.AnnotationUnderlayIP: nil})
		case 3:
			if err := api.Delete(ctx, name(i), metav1.DeleteOptions{}); err != nil {
				t.Error(err)
			}
		case 4: // an annotation Village does not read: the record stays
			lab.patch(name(i), map[string]any{"example.com/other": "x"})
		}
	})
	if fulls := lab.converged("after the changes"); fulls != 1 {
		t.Fatalf("%d full batches: changes came as full lists", fulls)
	}
	lab.mu.Lock()
	defer lab.mu.Unlock()
	if _, ok := lab.view[name(6)]; !ok || lab.view[name(6)].IP != "192.168.12.7" {
		t.Fatalf("changed Node %s is %+v", name(6), lab.view[name(6)])
	}
	for _, gone := range []string{name(2), name(3)} {
		if _, ok := lab.view[gone]; ok {
			t.Fatalf("%s is still fed", gone)
		}
	}
}

// Every event of some Nodes is lost on its way to the feed, and a stale
// record is fed after a newer one (an event out of order): the resync of
// the informer's cache repairs both.
func lostRepaired(t *testing.T, kube *kubetest.Server) {
	ctx := context.Background()
	api := kube.Client.CoreV1().Nodes()
	var dropped atomic.Int64
	lost := func(name string) bool {
		if strings.HasPrefix(name, "l-lost") {
			dropped.Add(1)
			return true
		}
		return false
	}
	lab := newFeedLab(t, kube, "l-self", 2*time.Second, lost)
	for i := range 20 {
		if _, err := api.Create(ctx, peerNode(fmt.Sprintf("l-ok%02d", i), fmt.Sprintf("192.168.20.%d", i+1), fmt.Sprintf("10.20.%d.0/24", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if _, err := api.Create(ctx, peerNode(fmt.Sprintf("l-lost%d", i), fmt.Sprintf("192.168.21.%d", i+1), fmt.Sprintf("10.21.%d.0/24", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lab.patch("l-ok00", map[string]any{kubenames.AnnotationUnderlayIP: "192.168.22.1"})
	lab.converged("lost creations")
	if dropped.Load() == 0 {
		t.Fatal("no event was lost: the test proves nothing")
	}
	lab.mu.Lock()
	if _, ok := lab.view["l-lost0"]; !ok {
		t.Fatal("converged without the lost Node")
	}
	lab.mu.Unlock()

	// An old record of l-ok00, delivered after its newer one.
	stale := registry.Node{Name: "l-ok00", IP: "192.168.20.1", PodCIDRs: []string{"10.20.0.0/24"}}
	lab.feed.Put(stale, 1)
	deadline := time.Now().Add(time.Minute)
	for {
		lab.mu.Lock()
		ip := lab.view["l-ok00"].IP
		lab.mu.Unlock()
		if ip == stale.IP {
			break // the reader took the stale record
		}
		if time.Now().After(deadline) {
			t.Fatal("the stale record never reached the reader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	lab.converged("a stale record")
	// A lost deletion too.
	if err := api.Delete(ctx, "l-lost1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lab.converged("a lost deletion")
}
