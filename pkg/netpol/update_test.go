package netpol

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/table"
)

// randWorld is a cluster small enough to dump after every step: pods
// p0..p(n-1) in namespaces n0..n2, some of them on this node, dual stack,
// and policies drawn at random.
type randWorld struct {
	pods     map[string]*Pod
	local    map[string]bool
	policies map[string]*networkingv1.NetworkPolicy
	nss      map[string]map[string]string
}

func (w *randWorld) input() Input {
	in := Input{Network: "r", Namespaces: map[string]map[string]string{}, Local: map[string]bool{}}
	for _, k := range slices.Sorted(maps.Keys(w.pods)) {
		p := *w.pods[k]
		in.Pods = append(in.Pods, &p)
		if w.local[k] {
			in.Local[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(w.policies)) {
		in.Policies = append(in.Policies, w.policies[k])
	}
	maps.Copy(in.Namespaces, w.nss)
	return in
}

// change is one edit of the world, valid in any order (an upsert or a
// delete that tolerates absence).
type change struct {
	what string
	do   func(*randWorld)
}

const randPods = 24

func randLabels(r *rand.Rand) map[string]string {
	return map[string]string{"app": fmt.Sprintf("a%d", r.IntN(4)), "tier": fmt.Sprintf("t%d", r.IntN(2))}
}

// randPod is pod i with addresses of its own (10.77.i.x and fd77::i:x),
// so no two pods ever share one whatever the order of the changes.
func randPod(r *rand.Rand, i int) *Pod {
	x := 2 + r.IntN(3)
	p := pod(fmt.Sprintf("n%d", i%3), fmt.Sprintf("p%d", i), randLabels(r),
		fmt.Sprintf("10.77.%d.%d", i, x), fmt.Sprintf("fd77::%d:%d", i, x))
	if r.IntN(2) == 0 {
		p.Ports = []NamedPort{{Name: "web", Protocol: table.ProtoTCP, Port: uint16(8000 + r.IntN(3))}}
	}
	return p
}

func randPeer(r *rand.Rand) networkingv1.NetworkPolicyPeer {
	switch r.IntN(4) {
	case 0:
		return networkingv1.NetworkPolicyPeer{PodSelector: sel("app", fmt.Sprintf("a%d", r.IntN(4)))}
	case 1:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", fmt.Sprint(r.IntN(2)))}
	case 2:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel(), PodSelector: sel("tier", fmt.Sprintf("t%d", r.IntN(2)))}
	}
	// a block over some pods' addresses less one of them
	i := r.IntN(randPods)
	if r.IntN(2) == 0 {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("10.77.%d.0/22", i&^3), Except: []string{fmt.Sprintf("10.77.%d.0/24", i)}}}
	}
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "fd77::/64", Except: []string{fmt.Sprintf("fd77::%d:0/112", i)}}}
}

func randPorts(r *rand.Rand) []networkingv1.NetworkPolicyPort {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []networkingv1.NetworkPolicyPort{named(corev1.ProtocolTCP, "web")}
	case 2:
		return []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolUDP), Port: ptr(intOrString(53)), EndPort: ptr(int32(60))}}
	}
	return []networkingv1.NetworkPolicyPort{tcp(80 + r.IntN(2))}
}

func randPolicy(r *rand.Rand, name string) *networkingv1.NetworkPolicy {
	spec := networkingv1.NetworkPolicySpec{PodSelector: *sel()}
	if r.IntN(3) > 0 {
		spec.PodSelector = *sel("app", fmt.Sprintf("a%d", r.IntN(4)))
	}
	spec.PolicyTypes = [][]networkingv1.PolicyType{ingressOnly, egressOnly, both}[r.IntN(3)]
	for range r.IntN(3) {
		var from []networkingv1.NetworkPolicyPeer
		for range r.IntN(3) {
			from = append(from, randPeer(r))
		}
		spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: from, Ports: randPorts(r)})
	}
	for range r.IntN(3) {
		var to []networkingv1.NetworkPolicyPeer
		for range r.IntN(3) {
			to = append(to, randPeer(r))
		}
		spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: to, Ports: randPorts(r)})
	}
	return policy(fmt.Sprintf("n%d", r.IntN(3)), name, spec)
}

// randChanges draws n changes of every kind: pods added, deleted,
// relabelled, readdressed, moved on or off the node; policies added,
// replaced, deleted; namespaces relabelled.
func randChanges(r *rand.Rand, n int) []change {
	var out []change
	for range n {
		i := r.IntN(randPods)
		k := fmt.Sprintf("n%d/p%d", i%3, i)
		var c change
		switch r.IntN(7) {
		case 0, 1:
			p := randPod(r, i)
			c = change{"upsert pod " + k, func(w *randWorld) { w.pods[k] = p }}
		case 2:
			c = change{"delete pod " + k, func(w *randWorld) { delete(w.pods, k); delete(w.local, k) }}
		case 3:
			on := r.IntN(3) > 0
			c = change{fmt.Sprintf("pod %s local %v", k, on), func(w *randWorld) { w.local[k] = on }}
		case 4, 5:
			name := fmt.Sprintf("pol%d", r.IntN(8))
			pol := randPolicy(r, name)
			c = change{"upsert policy " + pol.Namespace + "/" + name, func(w *randWorld) {
				for pk, old := range w.policies {
					if old.Name == name {
						delete(w.policies, pk)
					}
				}
				w.policies[pol.Namespace+"/"+name] = pol
			}}
		default:
			if r.IntN(2) == 0 {
				name := fmt.Sprintf("pol%d", r.IntN(8))
				c = change{"delete policy " + name, func(w *randWorld) {
					for pk, old := range w.policies {
						if old.Name == name {
							delete(w.policies, pk)
						}
					}
				}}
				break
			}
			nsName, team := fmt.Sprintf("n%d", r.IntN(3)), fmt.Sprint(r.IntN(2))
			c = change{"namespace " + nsName + " team=" + team, func(w *randWorld) { w.nss[nsName] = map[string]string{"team": team} }}
		}
		out = append(out, c)
	}
	return out
}

func newRandWorld(r *rand.Rand) *randWorld {
	w := &randWorld{pods: map[string]*Pod{}, local: map[string]bool{}, policies: map[string]*networkingv1.NetworkPolicy{},
		nss: map[string]map[string]string{"n0": {"team": "0"}, "n1": {"team": "1"}, "n2": {"team": "0"}}}
	for i := range randPods {
		p := randPod(r, i)
		w.pods[p.Key()] = p
		w.local[p.Key()] = i%4 != 3
	}
	for j := range 4 {
		pol := randPolicy(r, fmt.Sprintf("pol%d", j))
		w.policies[pol.Namespace+"/"+pol.Name] = pol
	}
	return w
}

var (
	handle   = regexp.MustCompile(` # handle \d+`)
	elements = regexp.MustCompile(`(?s)elements = \{([^}]*)\}`)
	blocks   = regexp.MustCompile(`(?ms)^\t(?:set|map|chain|counter) [^\n]*\{\n.*?^\t\}`)
)

// dump is the policy table as the kernel lists it (nft -s: no counts),
// made comparable: the sets, maps and chains sorted by name, each set's
// elements sorted. The rules in a chain keep their order.
func dump(t *testing.T, n ns.NetNS, network string) string {
	t.Helper()
	out := handle.ReplaceAllString(testenv.Nft(t, n, "-s", "list", "table", "inet", table.PolicyTable(network)), "")
	out = elements.ReplaceAllStringFunc(out, func(m string) string {
		body := elements.FindStringSubmatch(m)[1]
		var elems []string
		for _, e := range strings.Split(body, ",") {
			if e = strings.Join(strings.Fields(e), " "); e != "" {
				elems = append(elems, e)
			}
		}
		slices.Sort(elems)
		return "elements = { " + strings.Join(elems, ", ") + " }"
	})
	bs := blocks.FindAllString(out, -1)
	if len(bs) < 5 {
		t.Fatalf("the policy table lists %d sets, maps and chains (the forward chain and four maps at least):\n%s", len(bs), out)
	}
	slices.Sort(bs)
	return strings.Join(bs, "\n")
}

// TestUpdateMatchesCompile: a random sequence of changes of pods,
// policies and namespaces, replayed in several random orders, each change
// installed with table.Update (only what differs) in one node namespace
// and with a full table.Apply of the same compile in another: after every
// change both kernels list the same table. Traffic under Update is
// TestEnforce/update.
func TestUpdateMatchesCompile(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 22))
	changes := randChanges(r, 60)
	inc, full := testenv.NewNS(t), testenv.NewNS(t)
	updates := 0
	// last stays across orders: an order starts from the previous one's
	// table, by an Update too
	var last *table.Ruleset
	for order := range 3 {
		w := newRandWorld(rand.New(rand.NewPCG(seed, 7)))
		steps := slices.Clone(changes)
		r.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
		rs := Compile(w.input())
		step := func(what string) {
			t.Helper()
			if err := testenv.InNS(inc, func() error { return table.Update(last, rs) }); err != nil {
				t.Fatalf("order %d, %s: %v", order, what, err)
			}
			if err := testenv.InNS(full, func() error { return table.Apply(rs) }); err != nil {
				t.Fatalf("order %d, %s: %v", order, what, err)
			}
			if last != nil {
				updates += table.Changes(last, rs)
			}
			if a, b := dump(t, inc, "r"), dump(t, full, "r"); a != b {
				t.Fatalf("order %d, after %s: the updated table differs from the full one\nupdated:\n%s\nfull:\n%s", order, what, a, b)
			}
			last = rs
		}
		step("the initial world")
		for _, c := range steps {
			c.do(w)
			rs = Compile(w.input())
			step(c.what)
		}
		t.Logf("order %d: %d policies, %d isolated pods, %d sets at the end", order, len(w.policies), len(rs.Pods), len(rs.Sets))
	}
	if updates < 100 {
		t.Errorf("the changes updated only %d elements, chains and sets: the test proves little", updates)
	}
}
