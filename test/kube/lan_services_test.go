package kube_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/test/attack"
)

// The LAN Service ranges of lanServices (issue 39): ten addresses of
// each family of the cluster's LAN, outside the LAN pods' pool.
const (
	svcFirst  = kubecluster.LANPrefix + "150"
	svcLast   = kubecluster.LANPrefix + "159"
	svcFirst6 = kubecluster.LANPrefix6 + "150"
	svcLast6  = kubecluster.LANPrefix6 + "159"
	// svcAsked is the address pair the lan-ip Service asks for.
	svcAsked  = kubecluster.LANPrefix + "155"
	svcAsked6 = kubecluster.LANPrefix6 + "155"
)

// svcServices is "macvlan.services" of lanServices.
var svcServices = fmt.Sprintf(`{ "gossipKeyFile": "/etc/village/gossip/key", "ranges": [[{ "subnet": "%s0/24", "rangeStart": "%s", "rangeEnd": "%s" }], [{ "subnet": "%s/64", "rangeStart": "%s", "rangeEnd": "%s" }]] }`,
	kubecluster.LANPrefix, svcFirst, svcLast, kubecluster.LANPrefix6, svcFirst6, svcLast6)

// installLANServicesConfig installs the home-lab LAN ConfigMap with
// "macvlan.services" (the JSON object services) and an IPv6 set in the LAN
// pool beside the IPv4 one (a Service range must lie in a LAN subnet), and
// the example's lan-services.yaml for those ranges (without it the agent
// has no right to a Service), and waits until every node's conflist has
// them.
func installLANServicesConfig(t testing.TB, c *kubecluster.Cluster, services string) {
	t.Helper()
	// The gossip key, made as README "Services on the LAN" tells users
	// to (the DaemonSet mounts the Secret at /etc/village/gossip); one per
	// cluster, kept when a later test installs the config again.
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	_, err := c.Client().CoreV1().Secrets(kubecluster.VillageNamespace).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "village-gossip"},
		Data:       map[string][]byte{"key": []byte(base64.StdEncoding.EncodeToString(key) + "\n")},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("Secret village-gossip: %v", err)
	}
	applyLANServicesGrant(t, c, services)
	services = `"services": ` + services + `,`
	applyHomeLab(t, c, homeLab{
		file: "configmap-lan.yaml",
		replace: [][2]string{
			{`"rangeStart": "192.168.50.210"`, `"rangeStart": "` + lanFirst + `"`},
			{`"rangeEnd": "192.168.50.239"`, `"rangeEnd": "` + lanLast + `"`},
			{`"subnet": "192.168.50.0/24"`, `"subnet": "` + kubecluster.LANPrefix + `0/24"`},
			{`"gateway": "192.168.50.1"`, `"gateway": "` + kubecluster.LANIP + `" }], [{ "subnet": "` + kubecluster.LANPrefix6 + `/64", "rangeStart": "` + kubecluster.LANPrefix6 + `100", "rangeEnd": "` + kubecluster.LANPrefix6 + `103"`},
			{`"hostShim": true,`, `"hostShim": true, ` + services},
		},
		then: []string{"-n", kubecluster.VillageNamespace, "rollout", "restart", "daemonset/" + kubecluster.VillageDaemonSet},
		ready: func(n *kubecluster.Node) error {
			out, err := n.Exec("cat", "/etc/cni/net.d/10-village.conflist")
			if err != nil || !strings.Contains(string(out), `"services"`) {
				return fmt.Errorf("conflist on %s without macvlan.services (%v)", n.Name, err)
			}
			out, err = n.Exec("cat", "/run/village/kube/kubeconfig")
			if err != nil || !strings.Contains(string(out), "tokenFile") {
				return fmt.Errorf("no host kubeconfig on %s (%v)", n.Name, err)
			}
			return nil
		},
	})
	// Every node's agent gossips under the key (the Secret is mounted).
	if err := kubecluster.Poll(wait, func() error {
		ctx := context.Background()
		pods, err := c.Client().CoreV1().Pods(kubecluster.VillageNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubecluster.VillageSelector})
		if err != nil {
			return err
		}
		keyed := map[string]bool{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			log, err := c.Client().CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("logs of %s: %w", p.Name, err)
			}
			if strings.Contains(string(log), "encrypted and authenticated") {
				keyed[p.Spec.NodeName] = true
			}
		}
		if len(keyed) != len(c.Nodes()) {
			return fmt.Errorf("agents on %v log LAN Services with encrypted and authenticated gossip, want all %d nodes", keyed, len(c.Nodes()))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// applyLANServicesGrant applies the home-lab example's lan-services.yaml
// (the agent's Services grant, and the admission policy keeping the
// addresses it writes in the LAN Service ranges) with the ranges of
// services, a "macvlan.services" JSON object, in place of the example's.
func applyLANServicesGrant(t testing.TB, c *kubecluster.Cluster, services string) {
	t.Helper()
	var conf struct {
		Ranges [][]struct {
			RangeStart string `json:"rangeStart"`
			RangeEnd   string `json:"rangeEnd"`
		} `json:"ranges"`
	}
	if err := json.Unmarshal([]byte(services), &conf); err != nil {
		t.Fatalf("macvlan.services %s: %v", services, err)
	}
	var pairs []string
	for _, set := range conf.Ranges {
		for _, r := range set {
			pairs = append(pairs, "['"+r.RangeStart+"', '"+r.RangeEnd+"']")
		}
	}
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "examples", "homelab", "lan-services.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const example = `"[['192.168.50.240', '192.168.50.250']]"`
	if !strings.Contains(string(b), example) {
		t.Fatalf("lan-services.yaml has no ranges %s", example)
	}
	f := filepath.Join(t.TempDir(), "lan-services.yaml")
	if err := os.WriteFile(f, []byte(strings.Replace(string(b), example, `"[`+strings.Join(pairs, ", ")+`]"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", f); err != nil {
		t.Fatalf("kubectl apply -f lan-services.yaml: %v\n%s", err, out)
	}
}

// lbSpec is one LoadBalancer Service of lanServices.
type lbSpec struct {
	name     string
	selector map[string]string
	policy   corev1.ServiceExternalTrafficPolicy
	ann      map[string]string
	port     int32  // the Service port (to the pods' 8080); 0: 80
	class    string // spec.loadBalancerClass; "": none
}

func (f *fixture) loadBalancer(s lbSpec) {
	f.t.Helper()
	if s.port == 0 {
		s.port = 80
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Annotations: s.ann},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			Selector:              s.selector,
			ExternalTrafficPolicy: s.policy,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: s.port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	if s.class != "" {
		svc.Spec.LoadBalancerClass = &s.class
	}
	if _, err := f.c.Client().CoreV1().Services(f.ns).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("Service %s/%s: %v", f.ns, s.name, err)
	}
}

// ingress waits until the Service's status has LAN addresses (want of
// them), every one with ipMode VIP, and returns them.
func (f *fixture) ingress(t testing.TB, name string, want int) []string {
	t.Helper()
	var ips []string
	if err := kubecluster.Poll(wait, func() error {
		svc, err := f.c.Client().CoreV1().Services(f.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ips = ips[:0]
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IPMode == nil || *in.IPMode != corev1.LoadBalancerIPModeVIP {
				return fmt.Errorf("ingress %+v without ipMode VIP", in)
			}
			ips = append(ips, in.IP)
		}
		if len(ips) != want {
			return fmt.Errorf("ingress %v, want %d address(es)", ips, want)
		}
		return nil
	}); err != nil {
		t.Fatalf("Service %s/%s: %v", f.ns, name, err)
	}
	return ips
}

// announcerNode waits until the Service names its announcing node in
// village.cni.io/lan-announcer (other than not, if given) and returns it.
func (f *fixture) announcerNode(t *testing.T, name, not string) *kubecluster.Node {
	t.Helper()
	var v string
	if err := kubecluster.Poll(wait, func() error {
		svc, err := f.c.Client().CoreV1().Services(f.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v = svc.Annotations[kubenames.AnnotationLANAnnouncer]; v == "" || v == not {
			return fmt.Errorf("%s is %q", kubenames.AnnotationLANAnnouncer, v)
		}
		return nil
	}); err != nil {
		t.Fatalf("Service %s/%s: %v", f.ns, name, err)
	}
	return node(t, f.c, v)
}

// serviceEvent waits for an Event of type and reason on the Service whose
// message names what.
func (f *fixture) serviceEvent(t *testing.T, name, typ, reason, what string) {
	t.Helper()
	var seen []string
	if err := kubecluster.Poll(wait, func() error {
		evs, err := f.c.Client().CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.kind=Service,involvedObject.name=" + name})
		if err != nil {
			return err
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
			if e.Type == typ && e.Reason == reason && strings.Contains(e.Message, what) {
				return nil
			}
		}
		return fmt.Errorf("no %s %s Event naming %q", typ, reason, what)
	}); err != nil {
		t.Fatalf("Service %s/%s: %v; Events: %q", f.ns, name, err, seen)
	}
}

// lanHTTP gets http://addr/ from the LAN client and returns the body.
func lanHTTP(c *kubecluster.Cluster, addr string) func() (string, error) {
	return lanHTTPWithin(c, addr, 3*time.Second, 5*time.Second)
}

// lanHTTPWithin is lanHTTP with the connect and whole-request timeouts
// given (the benchmark's probes give up sooner).
func lanHTTPWithin(c *kubecluster.Cluster, addr string, connect, total time.Duration) func() (string, error) {
	dial := testenv.DialerIn(c.LANClient())
	hc := &http.Client{Timeout: total, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(_ context.Context, _, a string) (net.Conn, error) { return dial(a, connect) }}}
	return func() (string, error) {
		resp, err := hc.Get("http://" + addr + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
		}
		return strings.TrimSpace(string(b)), err
	}
}

// neighbourAnswers asks once from the LAN client who has ip (ARP or NDP by
// family) and returns every MAC that answered within d.
func neighbourAnswers(c *kubecluster.Cluster, ip string, d time.Duration) ([]string, error) {
	a := netip.MustParseAddr(ip)
	if a.Is4() {
		return testenv.ARPAnswers(c.LANClient(), "eth0", a, d)
	}
	return testenv.NDPAnswers(c.LANClient(), "eth0", a, d)
}

// oneMAC waits until someone answers for ip, then asks `checks` more
// times: every answer must come from exactly one MAC, the same each time,
// and, given want, that one. It returns the MAC.
func oneMAC(t testing.TB, c *kubecluster.Cluster, ip, want string, checks int) string {
	t.Helper()
	var macs []string
	if err := kubecluster.Poll(wait, func() error {
		var err error
		if macs, err = neighbourAnswers(c, ip, 300*time.Millisecond); err != nil {
			return err
		}
		if len(macs) == 0 {
			return fmt.Errorf("nobody answers for %s", ip)
		}
		if want != "" && !slices.Equal(macs, []string{want}) {
			return fmt.Errorf("answers for %s from %v, want %s", ip, macs, want)
		}
		return nil
	}); err != nil {
		t.Fatalf("LAN client: %v", err)
	}
	if len(macs) != 1 {
		t.Fatalf("LAN client: %s answered by %d MACs %v, want exactly one", ip, len(macs), macs)
	}
	for range checks {
		// An empty answer is a slow ARP reply on a loaded machine, asked
		// again (within wait); two MACs or another one fail at once.
		var got []string
		if err := kubecluster.Poll(wait, func() error {
			var err error
			if got, err = neighbourAnswers(c, ip, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				return fmt.Errorf("nobody answers for %s (after %v)", ip, macs)
			}
			return nil
		}); err != nil {
			t.Fatalf("LAN client: %v", err)
		}
		if !slices.Equal(got, macs) {
			t.Fatalf("LAN client: %s answered by %v after %v: not exactly one steady MAC", ip, got, macs)
		}
	}
	return macs[0]
}

// steadyMAC asks who has ip until the same single MAC has answered
// `checks` times in a row, and returns that MAC and how long it took. Two
// MACs in one answer (split brain) fail the test at once; no answer, or
// another single MAC, only restarts the count: when a node returns, the
// address may move back to it, and the new holder probes before it answers.
func steadyMAC(t testing.TB, c *kubecluster.Cluster, ip string, checks int) (string, time.Duration) {
	t.Helper()
	s := settle(t, c, ip, checks, wait, true)
	switch {
	case len(s.splitMACs) > 0:
		t.Fatalf("LAN client: %s answered by %d MACs at once %v: split brain", ip, len(s.splitMACs), s.splitMACs)
	case s.mac == "":
		t.Fatalf("LAN client: no steady single MAC for %s within %v; answers seen: %v", ip, wait, s.seen)
	}
	return s.mac, s.took
}

// settled is what settle saw.
type settled struct {
	mac       string        // the steady MAC, "" if none within the limit
	took      time.Duration // from the first question to the steady MAC (or the split, or the limit)
	splitMACs []string      // every MAC of answers that came from two MACs or more at once, sorted
	splitFor  time.Duration // first to last such answer: a lower bound of the split brain
	seen      []string      // the answers in order, repeats folded
}

// settle asks who has ip (every 300 ms at most) until one MAC has answered
// `checks` times in a row, for at most limit. An answer from two MACs at
// once is a split brain: with stopOnSplit settle returns at the first;
// without, it counts and waits through it (the benchmark lets MetalLB's
// heal and measures it).
func settle(t testing.TB, c *kubecluster.Cluster, ip string, checks int, limit time.Duration, stopOnSplit bool) settled {
	t.Helper()
	var s settled
	start := time.Now()
	var first, last time.Time
	split := map[string]bool{}
	run := 0
	var prev string
	for time.Since(start) < limit {
		macs, err := neighbourAnswers(c, ip, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		cur := strings.Join(macs, "+")
		if len(s.seen) == 0 || s.seen[len(s.seen)-1] != cur {
			s.seen = append(s.seen, cur)
		}
		if len(macs) > 1 {
			if first.IsZero() {
				first = time.Now()
			}
			last = time.Now()
			for _, m := range macs {
				split[m] = true
			}
			if stopOnSplit {
				break
			}
			prev, run = "", 0
			continue
		}
		if cur == "" || cur != prev {
			prev, run = cur, 0
		}
		if cur != "" {
			run++
		}
		if run >= checks {
			s.mac = cur
			break
		}
	}
	s.took = time.Since(start)
	s.splitFor = last.Sub(first)
	for m := range split {
		s.splitMACs = append(s.splitMACs, m)
	}
	slices.Sort(s.splitMACs)
	return s
}

// lanMAC is n's LAN interface MAC.
func lanMAC(t testing.TB, n *kubecluster.Node) string {
	t.Helper()
	mac, err := n.LANMAC()
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// failover takes the node answering for ip off the LAN (its bridge port
// down, as a pulled cable) and returns how long until the LAN client gets
// an answer for ip from another MAC, and that MAC. The node stays off
// the LAN until the caller plugs it back (the cleanup does at the latest).
func failover(t testing.TB, c *kubecluster.Cluster, ip string, from *kubecluster.Node, fromMAC string) (time.Duration, string) {
	t.Helper()
	d, mac := failoverWithin(t, c, ip, from, fromMAC, 2*time.Minute)
	if mac == "" {
		t.Fatalf("nobody answers for %s within 2 minutes of %s leaving the LAN", ip, from.Name)
	}
	return d, mac
}

// failoverWithin is failover bounded by limit: no new MAC by then returns
// an empty MAC.
func failoverWithin(t testing.TB, c *kubecluster.Cluster, ip string, from *kubecluster.Node, fromMAC string, limit time.Duration) (time.Duration, string) {
	t.Helper()
	t.Cleanup(func() { _ = from.PlugLAN() })
	if err := from.UnplugLAN(); err != nil {
		t.Fatalf("unplugging %s: %v", from.Name, err)
	}
	start := time.Now()
	for time.Since(start) < limit {
		macs, err := neighbourAnswers(c, ip, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range macs {
			if m != fromMAC {
				return time.Since(start), m
			}
		}
	}
	return time.Since(start), ""
}

// takeoverSeen says whether the capture shows the burst of a takeover of
// ip by mac: gratuitous ARP in both forms (broadcast) for IPv4, an
// unsolicited neighbour advertisement for IPv6.
func takeoverSeen(capture, ip, mac string) error {
	var req, rep, na bool
	for _, l := range strings.Split(capture, "\n") {
		if !strings.HasPrefix(l, mac+" > ") && !strings.Contains(l, " "+mac+" > ") {
			continue
		}
		switch {
		case strings.Contains(l, "Request who-has "+ip+" ") && strings.Contains(l, " tell "+ip+","):
			req = true
		case strings.Contains(l, "> ff:ff:ff:ff:ff:ff") && strings.Contains(l, "Reply "+ip+" is-at "+mac):
			rep = true
		case strings.Contains(l, "neighbor advertisement") && strings.Contains(l, "tgt is "+ip+","):
			na = true
		}
	}
	switch {
	case strings.Contains(ip, ":") && !na:
		return fmt.Errorf("no unsolicited neighbour advertisement of %s from %s", ip, mac)
	case !strings.Contains(ip, ":") && !(req && rep):
		return fmt.Errorf("gratuitous ARP of %s from %s: request form %v, reply form %v", ip, mac, req, rep)
	}
	return nil
}

// lanServices is issue 39 on a running two-node cluster: LoadBalancer
// Services get addresses of the LAN that one node answers for, through
// the shipped DaemonSet and kube-proxy in the cluster's mode.
func lanServices(t *testing.T, c *kubecluster.Cluster) {
	installLANServicesConfig(t, c, svcServices)
	f := newFixture(t, c, "lansvc")
	labelNS(t, c, f.ns, kubenames.LabelLANAllowed)
	no := newFixture(t, c, "lansvc-no")
	n1, n2 := node(t, c, "node-1"), node(t, c, "node-2")
	web := map[string]string{"tier": "web"}
	for _, p := range []struct{ name, node string }{{"web-1", n1.Name}, {"web-2", n2.Name}} {
		pod := podSpec(p.name, p.node, corev1.RestartPolicyAlways, "-http", ":8080", "-reply", p.name)
		pod.Labels["tier"] = "web"
		f.create(pod)
	}
	f.running("web-1", "web-2")
	local, cluster := corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyCluster

	created := time.Now()
	f.loadBalancer(lbSpec{name: "web", selector: web, policy: local})
	var webIP string
	t.Run("LocalHTTPFromOwnSource", func(t *testing.T) {
		webIP = f.ingress(t, "web", 1)[0]
		if a := netip.MustParseAddr(webIP); a.Less(netip.MustParseAddr(svcFirst)) || netip.MustParseAddr(svcLast).Less(a) {
			t.Fatalf("web's address %s outside the Service range %s-%s", webIP, svcFirst, svcLast)
		}
		var got string
		if err := kubecluster.Poll(wait, func() error {
			var err error
			got, err = lanHTTP(c, webIP)()
			return err
		}); err != nil {
			t.Fatalf("LAN client -> http://%s: %v", webIP, err)
		}
		t.Logf("LAN Service web: first answered request %v after the Service's creation (load %s)", time.Since(created).Round(time.Millisecond), loadavg())
		if !strings.HasSuffix(got, " "+kubecluster.LANClientIP) || !strings.HasPrefix(got, "web-") {
			t.Fatalf("LAN client -> http://%s: %q, want web-N seeing the client's own address %s", webIP, got, kubecluster.LANClientIP)
		}
		f.serviceEvent(t, "web", corev1.EventTypeNormal, kubenames.ReasonLANAssigned, webIP)
	})
	// A stolen node token against the Services (test/attack): another
	// class's or namespace's status, externalIPs, the spec; then every
	// other write beyond its node's own (nodetoken.go): Nodes, pods,
	// addresses outside the Service ranges, Leases, Events, Secrets, tokens.
	t.Run("NodeTokenAttacks", func(t *testing.T) {
		p, ok := villagePods(t, c)[n1.Name]
		if !ok {
			t.Fatalf("no Village pod on %s", n1.Name)
		}
		agent := agentClient(t, c, n1, &p)
		attack.NodeTokenServices(t, c, agent, f.ns)
		attack.NodeTokenWrites(t, c, agent, attack.NodeTokenTargets{Node: n1.Name, OtherNode: n2.Name,
			AllowedNS: f.ns, OtherPod: "web-2", Router: kubecluster.LANIP})
	})
	t.Run("OneMACIsTheAnnouncer", func(t *testing.T) {
		a := f.announcerNode(t, "web", "")
		oneMAC(t, c, webIP, lanMAC(t, a), 5)
		f.serviceEvent(t, "web", corev1.EventTypeNormal, kubenames.ReasonLANAnnounced, a.Name)
	})
	t.Run("LocalFollowsTheEndpoint", func(t *testing.T) {
		// Only node-2 has an endpoint: only node-2 may answer.
		f.loadBalancer(lbSpec{name: "only-2", selector: map[string]string{"app": "web-2"}, policy: local})
		ip := f.ingress(t, "only-2", 1)[0]
		if a := f.announcerNode(t, "only-2", ""); a.Name != n2.Name {
			t.Fatalf("only-2 (Local, endpoint on node-2) announced by %s", a.Name)
		}
		oneMAC(t, c, ip, lanMAC(t, n2), 3)
		expect(t, "LAN client -> only-2", "web-2 "+kubecluster.LANClientIP, lanHTTP(c, ip))
	})
	t.Run("Cluster", func(t *testing.T) {
		f.loadBalancer(lbSpec{name: "web-cluster", selector: web, policy: cluster})
		ip := f.ingress(t, "web-cluster", 1)[0]
		oneMAC(t, c, ip, lanMAC(t, f.announcerNode(t, "web-cluster", "")), 3)
		if err := kubecluster.Poll(wait, func() error {
			got, err := lanHTTP(c, ip)()
			if err == nil && !strings.HasPrefix(got, "web-") {
				err = fmt.Errorf("answer %q", got)
			}
			return err
		}); err != nil {
			t.Fatalf("LAN client -> http://%s (Cluster): %v", ip, err)
		}
	})
	var dualMAC string
	var dualNode *kubecluster.Node
	t.Run("LANIP", func(t *testing.T) {
		f.loadBalancer(lbSpec{name: "dual", selector: web, policy: local,
			ann: map[string]string{kubenames.AnnotationLANIP: svcAsked + "," + svcAsked6}})
		ips := f.ingress(t, "dual", 2)
		slices.Sort(ips)
		if want := []string{svcAsked, svcAsked6}; !slices.Equal(ips, want) {
			t.Fatalf("dual's ingress %v, want %v", ips, want)
		}
		dualNode = f.announcerNode(t, "dual", "")
		dualMAC = oneMAC(t, c, svcAsked, lanMAC(t, dualNode), 3)
		if err := kubecluster.Poll(wait, func() error {
			got, err := lanHTTP(c, svcAsked)()
			if err == nil && !strings.HasSuffix(got, " "+kubecluster.LANClientIP) {
				err = fmt.Errorf("answer %q", got)
			}
			return err
		}); err != nil {
			t.Fatalf("LAN client -> http://%s: %v", svcAsked, err)
		}
		// Asked again by another Service: refused with an Event, never
		// another address.
		f.loadBalancer(lbSpec{name: "dual-again", selector: web, policy: local,
			ann: map[string]string{kubenames.AnnotationLANIP: svcAsked}})
		f.serviceEvent(t, "dual-again", corev1.EventTypeWarning, kubenames.ReasonLANTaken, svcAsked)
		if svc, err := c.Client().CoreV1().Services(f.ns).Get(context.Background(), "dual-again", metav1.GetOptions{}); err != nil || len(svc.Status.LoadBalancer.Ingress) != 0 {
			t.Fatalf("dual-again: ingress %v (%v), want none", svc.Status.LoadBalancer.Ingress, err)
		}
	})
	t.Run("IPv6NDP", func(t *testing.T) {
		if dualNode == nil {
			t.Fatal("LANIP failed: no dual-stack Service")
		}
		oneMAC(t, c, svcAsked6, lanMAC(t, dualNode), 3)
	})
	t.Run("LANShare", func(t *testing.T) {
		share := map[string]string{kubenames.AnnotationLANShare: "home"}
		f.loadBalancer(lbSpec{name: "share-a", selector: map[string]string{"app": "web-1"}, policy: cluster, ann: share, port: 80})
		f.loadBalancer(lbSpec{name: "share-b", selector: map[string]string{"app": "web-2"}, policy: cluster, ann: share, port: 81})
		a, b := f.ingress(t, "share-a", 1)[0], f.ingress(t, "share-b", 1)[0]
		if a != b {
			t.Fatalf("share-a has %s, share-b %s: want one address", a, b)
		}
		oneMAC(t, c, a, "", 3)
		expect(t, "LAN client -> share-a", "web-1", firstWord(lanHTTP(c, a)))
		expect(t, "LAN client -> share-b", "web-2", firstWord(lanHTTP(c, a+":81")))
		f.loadBalancer(lbSpec{name: "share-clash", selector: web, policy: cluster, ann: share, port: 80})
		f.serviceEvent(t, "share-clash", corev1.EventTypeWarning, kubenames.ReasonLANPortsClash, "")
		// The key is per namespace: the same key elsewhere is another address.
		other := newFixture(t, c, "lansvc-other")
		labelNS(t, c, other.ns, kubenames.LabelLANAllowed)
		other.loadBalancer(lbSpec{name: "share-a", selector: web, policy: cluster, ann: share, port: 82})
		if o := other.ingress(t, "share-a", 1)[0]; o == a {
			t.Fatalf("lan-share %q of namespace %s got %s's address %s", "home", other.ns, f.ns, a)
		}
	})
	t.Run("ForbiddenNamespaceEvent", func(t *testing.T) {
		no.loadBalancer(lbSpec{name: "asks", selector: web, policy: cluster})
		no.serviceEvent(t, "asks", corev1.EventTypeWarning, kubenames.ReasonLANForbidden, kubenames.LabelLAN)
		svc, err := c.Client().CoreV1().Services(no.ns).Get(context.Background(), "asks", metav1.GetOptions{})
		if err != nil || len(svc.Status.LoadBalancer.Ingress) != 0 {
			t.Fatalf("Service of a forbidden namespace: ingress %v (%v), want none", svc.Status.LoadBalancer.Ingress, err)
		}
	})
	// A user with one namespace given the LAN aims every key it controls
	// at addresses Village must never take (test/attack).
	t.Run("AttackNamespaceUser", func(t *testing.T) {
		attack.NamespaceUserOnTheLAN(t, c, attack.LANAttack{Held: f.ingress(t, "share-a", 1)[0], HeldShare: "home", Node: n1.Name})
	})
	// takeOver takes from off the LAN while mac answers for svcAsked, and
	// returns the other node, which must have taken it over, and how long
	// that took.
	takeOver := func(t *testing.T, from *kubecluster.Node, mac string) (*kubecluster.Node, time.Duration) {
		t.Helper()
		d, to := failover(t, c, svcAsked, from, mac)
		other := n1
		if from == n1 {
			other = n2
		}
		if to != lanMAC(t, other) {
			t.Fatalf("after %s left, %s answered by %s, want %s's %s", from.Name, svcAsked, to, other.Name, lanMAC(t, other))
		}
		return other, d
	}
	// Failover of the dual-stack Service: its announcer leaves the LAN, the
	// other node (with its own endpoint, Local) takes both addresses over.
	t.Run("Failover", func(t *testing.T) {
		if dualNode == nil {
			t.Fatal("LANIP failed: no Service to fail over")
		}
		capture := testenv.StartCapture(t, c.LAN(), "lan0", "arp or icmp6")
		from := dualNode
		other, d := takeOver(t, from, dualMAC)
		t.Logf("LAN Service failover (announcement, %s off the LAN): %v (load %s)", from.Name, d.Round(time.Millisecond), loadavg())
		mac := lanMAC(t, other)
		oneMAC(t, c, svcAsked6, mac, 0)
		expect(t, "LAN client -> dual after the failover", webOn(other), firstWord(lanHTTP(c, svcAsked)))
		out := capture.Stop()
		t.Run("CaptureShowsTakeover", func(t *testing.T) {
			for _, ip := range []string{svcAsked, svcAsked6} {
				if err := takeoverSeen(out, ip, mac); err != nil {
					t.Errorf("LAN capture: %v:\n%s", err, out)
				}
			}
		})
		t.Run("OldNodeReturnsOneMAC", func(t *testing.T) {
			if err := from.PlugLAN(); err != nil {
				t.Fatal(err)
			}
			for _, ip := range []string{svcAsked, svcAsked6} {
				mac, d := steadyMAC(t, c, ip, 10)
				t.Logf("%s back on the LAN: %s steadily answered by %s after %v", from.Name, ip, mac, d.Round(time.Millisecond))
			}
		})
	})
	t.Run("FailoverAPIServerFrozen", func(t *testing.T) {
		if dualNode == nil {
			t.Fatal("LANIP failed: no Service to fail over")
		}
		mac := oneMAC(t, c, svcAsked, "", 3)
		from := n1
		if mac == lanMAC(t, n2) {
			from = n2
		}
		thaw := c.FreezeAPIServer(t)
		taker, d := takeOver(t, from, mac)
		t.Logf("LAN Service failover with the API server frozen (%s off the LAN): %v (load %s)", from.Name, d.Round(time.Millisecond), loadavg())
		expect(t, "LAN client -> dual, API server frozen", webOn(taker), firstWord(lanHTTP(c, svcAsked)))
		if err := from.PlugLAN(); err != nil {
			t.Fatal(err)
		}
		for _, ip := range []string{svcAsked, svcAsked6} {
			mac, d := steadyMAC(t, c, ip, 10)
			t.Logf("%s back on the LAN, API server still frozen: %s steadily answered by %s after %v", from.Name, ip, mac, d.Round(time.Millisecond))
		}
		thaw()
	})
	t.Run("DeleteReleases", func(t *testing.T) {
		// Deleting dual releases both its addresses. Nothing else asks for
		// the IPv6 one: it falls silent. dual-again asked for the IPv4 one
		// and was refused: it gets it now (so that one never falls
		// silent), and deleting dual-again silences it in turn.
		silent := func(after, ip string) {
			t.Helper()
			if err := kubecluster.Poll(wait, func() error {
				macs, err := neighbourAnswers(c, ip, 300*time.Millisecond)
				if err == nil && len(macs) > 0 {
					err = fmt.Errorf("%s still answered by %v", ip, macs)
				}
				return err
			}); err != nil {
				t.Fatalf("after deleting %s: %v", after, err)
			}
		}
		if err := c.Client().CoreV1().Services(f.ns).Delete(context.Background(), "dual", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		silent("dual", svcAsked6)
		if got := f.ingress(t, "dual-again", 1)[0]; got != svcAsked {
			t.Fatalf("dual-again got %s, want the released %s", got, svcAsked)
		}
		oneMAC(t, c, svcAsked, "", 3)
		if err := c.Client().CoreV1().Services(f.ns).Delete(context.Background(), "dual-again", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		silent("dual-again", svcAsked)
	})
}

// firstWord is get's answer up to its first space.
func firstWord(get func() (string, error)) func() (string, error) {
	return func() (string, error) {
		s, err := get()
		if f := strings.Fields(s); len(f) > 0 {
			s = f[0]
		}
		return s, err
	}
}

// webOn names lanServices' web pod on n (web-1 on node-1, web-2 on node-2).
func webOn(n *kubecluster.Node) string { return "web-" + strings.TrimPrefix(n.Name, "node-") }

// loadavg is the machine's load (uptime's three figures), for the logs
// of measured times.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
