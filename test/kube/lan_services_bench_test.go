package kube_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/kubenames"
)

// benchServices is "macvlan.services" of BenchmarkLANServicesKube: 170
// IPv4 addresses of the cluster's LAN around the LAN pods' pool (.100-.103)
// and the nodes, ten IPv6 ones; requireClass, as beside MetalLB (which
// gets metallbPool).
var benchServices = fmt.Sprintf(`{ "requireClass": true, "gossipKeyFile": "/etc/village/gossip/key", "ranges": [[{ "subnet": "%[1]s0/24", "rangeStart": "%[1]s20", "rangeEnd": "%[1]s99" }, { "subnet": "%[1]s0/24", "rangeStart": "%[1]s110", "rangeEnd": "%[1]s199" }], [{ "subnet": "%[2]s/64", "rangeStart": "%[3]s", "rangeEnd": "%[4]s" }]] }`,
	kubecluster.LANPrefix, kubecluster.LANPrefix6, svcFirst6, svcLast6)

// BenchmarkLANServicesKube measures Services on the LAN (issue 39) on a
// two-node internal/kubecluster cluster (kube-proxy iptables, the shipped
// DaemonSet with the home-lab LAN ConfigMap and macvlan.services), a web
// pod on each node and externalTrafficPolicy Local:
//   - the time from a Service's creation to the first HTTP answer the LAN
//     client gets through its address (5 Services, one after the other);
//   - announcement failover: the announcing node's bridge port goes down
//     (a pulled cable) and the LAN client asks ARP every ~50 ms until
//     another MAC answers; back up, then one steady MAC again before the
//     next kill; $VILLAGE_LANSVC_KILLS kills (default 20), p50/p99;
//   - the same with the API server frozen (SIGSTOP) for each kill;
//   - with 100 LoadBalancer Services: the agents' CPU, RSS and API
//     requests per minute (the audit log: user agents villaged and
//     village-ipam-kube, the LAN pool store's client) over
//     one minute, beside the same minute with the 5 Services before;
//   - what a LAN client sees of a kill, for a Local and a Cluster
//     Service: HTTP every 100 ms until one answer, then until every answer
//     ($VILLAGE_LANSVC_STALE_KILLS kills, default 5; serviceRecovery);
//   - with $VILLAGE_METALLB_DIR (scripts/metallb.sh), MetalLB L2 side by
//     side in the same cluster (metallbSideBySide; with the API server
//     frozen for $VILLAGE_METALLB_FROZEN_KILLS kills, default the same,
//     0 skips).
//
// Every FIGURE line carries the load average.
func BenchmarkLANServicesKube(b *testing.B) {
	c := kubecluster.Start(b, kubecluster.Options{Audit: true})
	installLANServicesConfig(b, c, benchServices)
	f := newFixture(b, c, "lansvc-bench")
	labelNS(b, c, f.ns, kubenames.LabelLANAllowed)
	web := map[string]string{"tier": "web"}
	for _, p := range []struct{ name, node string }{{"web-1", "node-1"}, {"web-2", "node-2"}} {
		pod := podSpec(p.name, p.node, corev1.RestartPolicyAlways, "-http", ":8080", "-reply", p.name)
		pod.Labels["tier"] = "web"
		f.create(pod)
	}
	f.running("web-1", "web-2")
	kills := testenv.EnvCount("VILLAGE_LANSVC_KILLS", 20, 1)
	staleKills := testenv.EnvCount("VILLAGE_LANSVC_STALE_KILLS", 5, 1)
	for range b.N {
		var first []time.Duration
		var ip string
		for i := range 5 {
			name := fmt.Sprintf("first-%d", i)
			start := time.Now()
			f.loadBalancer(lbSpec{name: name, selector: web, policy: corev1.ServiceExternalTrafficPolicyLocal, class: kubenames.LoadBalancerClassLAN})
			addr := f.ingress(b, name, 1)[0]
			if err := kubecluster.Poll(wait, func() error { _, err := lanHTTP(c, addr)(); return err }); err != nil {
				b.Fatalf("LAN client -> %s (%s): %v", name, addr, err)
			}
			first = append(first, time.Since(start))
			if i == 0 {
				ip = addr
			}
		}
		b.Logf("FIGURE lansvc_kube_create_to_first_answer %s (load %s)", spread(first), loadavg())

		baseline := agentUsage(b, c, time.Minute)
		b.Logf("FIGURE lansvc_kube_agents_5_services %s (load %s)", baseline, loadavg())

		plain, back, missed := failoverLoop(b, c, ip, kills, false)
		b.Logf("FIGURE lansvc_kube_failover %s, no takeover within 10 s in %d of %d (load %s)", spread(plain), missed, kills, loadavg())
		b.Logf("FIGURE lansvc_kube_return_to_steady_mac %s (load %s)", spread(back), loadavg())
		frozen, backFrozen, missedFrozen := failoverLoop(b, c, ip, kills, true)
		b.Logf("FIGURE lansvc_kube_failover_apiserver_frozen %s, no takeover within 10 s in %d of %d (load %s)", spread(frozen), missedFrozen, kills, loadavg())
		b.Logf("FIGURE lansvc_kube_return_to_steady_mac_apiserver_frozen %s (load %s)", spread(backFrozen), loadavg())

		for i := range 95 {
			f.loadBalancer(lbSpec{name: fmt.Sprintf("many-%d", i), selector: web, policy: corev1.ServiceExternalTrafficPolicyCluster, class: kubenames.LoadBalancerClassLAN})
		}
		start := time.Now()
		for i := range 95 {
			f.ingress(b, fmt.Sprintf("many-%d", i), 1)
		}
		b.Logf("FIGURE lansvc_kube_95_more_services_addressed %v (load %s)", time.Since(start).Round(time.Millisecond), loadavg())
		// The steady state: once every one names its announcer (written
		// after the address), the creation burst's writes are over.
		if err := kubecluster.Poll(wait, func() error {
			for i := range 95 {
				svc, err := c.Client().CoreV1().Services(f.ns).Get(context.Background(), fmt.Sprintf("many-%d", i), metav1.GetOptions{})
				if err != nil {
					return err
				}
				if svc.Annotations[kubenames.AnnotationLANAnnouncer] == "" {
					return fmt.Errorf("many-%d names no announcer yet", i)
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		loaded := agentUsage(b, c, time.Minute)
		b.Logf("FIGURE lansvc_kube_agents_100_services %s (load %s)", loaded, loadavg())

		// What a client sees, beyond the announcement: with Local the new
		// announcer sends only to its own endpoint; with Cluster kube-proxy
		// still sends a share to the endpoint on the node that left until
		// its Node goes NotReady (the node monitor's grace period) and the
		// EndpointSlice drops it.
		for _, s := range []struct{ svc, ip, policy string }{
			{"first-0", ip, "local"},
			{"many-0", f.ingress(b, "many-0", 1)[0], "cluster"},
		} {
			r := serviceRecovery(b, c, f, s.svc, s.ip, staleKills)
			b.Logf("FIGURE lansvc_kube_client_recovery_%s first answer %s; every answer (%d in a row) %s; probes failed in between %d of %d (load %s)",
				s.policy, spread(r.first), recoveryStreak, spread(r.every), r.failed, r.probes, loadavg())
		}

		if dir := os.Getenv("VILLAGE_METALLB_DIR"); dir != "" {
			metallbSideBySide(b, c, f, dir, kills)
		} else {
			b.Logf("FIGURE metallb not run: VILLAGE_METALLB_DIR unset (scripts/metallb.sh builds it)")
		}
	}
}

// noTakeover bounds a kill's wait for another MAC in the benchmark: five
// times the 2 s p99 target; a kill past it counts as no takeover.
const noTakeover = 10 * time.Second

// metallbPool is MetalLB's address pool beside Village's ranges.
const metallbPool = kubecluster.LANPrefix + "230-" + kubecluster.LANPrefix + "239"

// metallbSideBySide installs MetalLB L2 (speaker and controller built by
// scripts/metallb.sh into dir, in images made with internal/ociimage as
// Village's is; its own metallb-native.yaml) in the same cluster, for
// Services without a class (Village has requireClass), and measures the
// same figures on one Local Service of the same web pods: creation to
// first answer, failover and return p50/p99 over kills cable pulls, and
// the same with the API server frozen (a failover that does not happen
// within noTakeover is counted and reported, not waited for; a split
// brain on return is counted, its length reported, and waited out for up
// to mlbSettle).
func metallbSideBySide(b *testing.B, c *kubecluster.Cluster, f *fixture, dir string, kills int) {
	b.Helper()
	for _, name := range []string{"speaker", "controller"} {
		file, err := ociimage.HostFile(filepath.Join(dir, name), "/"+name)
		if err != nil {
			b.Fatal(err)
		}
		img := ociimage.Image{Name: "quay.io/metallb/" + name + ":" + filepath.Base(dir)[len("metallb-"):], Entrypoint: []string{"/" + name}, Files: []ociimage.File{file}}
		out := filepath.Join(b.TempDir(), name+".tar")
		if err := ociimage.WriteFile(out, img); err != nil {
			b.Fatal(err)
		}
		if err := c.ImportImage(out); err != nil {
			b.Fatal(err)
		}
	}
	if out, err := c.Kubectl("apply", "-f", filepath.Join(dir, "metallb-native.yaml")); err != nil {
		b.Fatalf("MetalLB's manifest: %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"-n", "metallb-system", "rollout", "status", "deployment/controller", "--timeout=3m"},
		{"-n", "metallb-system", "rollout", "status", "daemonset/speaker", "--timeout=3m"},
	} {
		if out, err := c.Kubectl(args...); err != nil {
			b.Fatalf("MetalLB: %v\n%s", err, out)
		}
	}
	cr := filepath.Join(b.TempDir(), "metallb-l2.yaml")
	if err := os.WriteFile(cr, []byte(`apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan, namespace: metallb-system}
spec: {addresses: ["`+metallbPool+`"]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: lan, namespace: metallb-system}
spec: {ipAddressPools: [lan], interfaces: [eth0]}
`), 0o644); err != nil {
		b.Fatal(err)
	}
	// The test cluster's API server runs in the LAN namespace, outside
	// the nodes: no kube-proxy, no route to Service addresses, so it
	// cannot call MetalLB's validating webhook (a Service). Drop the
	// webhook; the pool and advertisement below are valid as written.
	if out, err := c.Kubectl("delete", "validatingwebhookconfiguration", "metallb-webhook-configuration", "--ignore-not-found"); err != nil {
		b.Fatalf("MetalLB's webhook: %v\n%s", err, out)
	}
	if err := kubecluster.Poll(wait, func() error { _, err := c.Kubectl("apply", "-f", cr); return err }); err != nil {
		b.Fatalf("MetalLB's pool: %v", err)
	}
	start := time.Now()
	f.loadBalancer(lbSpec{name: "mlb", selector: map[string]string{"tier": "web"}, policy: corev1.ServiceExternalTrafficPolicyLocal})
	var ip string
	if err := kubecluster.Poll(wait, func() error {
		svc, err := c.Client().CoreV1().Services(f.ns).Get(context.Background(), "mlb", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(svc.Status.LoadBalancer.Ingress) == 0 {
			return fmt.Errorf("no ingress yet")
		}
		ip = svc.Status.LoadBalancer.Ingress[0].IP
		_, err = lanHTTP(c, ip)()
		return err
	}); err != nil {
		b.Fatalf("MetalLB Service mlb: %v", err)
	}
	b.Logf("FIGURE metallb_create_to_first_answer %v (load %s)", time.Since(start).Round(time.Millisecond), loadavg())
	// Which MACs answer, asked ten times: more than one is MetalLB
	// answering twice (issue 39 expected it on a Village node from its
	// interface exclusions; the 14:57 run saw both nodes' eth0), reported,
	// then given mlbSettle to heal before the kills.
	seen := map[string]bool{}
	for range 10 {
		macs, err := neighbourAnswers(c, ip, 300*time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range macs {
			seen[m] = true
		}
	}
	if len(seen) != 1 {
		b.Logf("FIGURE metallb_answering_macs_before_kills %d for %s: %v (load %s)", len(seen), ip, whereMACs(c, slices.Collect(maps.Keys(seen))), loadavg())
	}
	frozenKills := testenv.EnvCount("VILLAGE_METALLB_FROZEN_KILLS", kills, 0)
	macs := nodesByMAC(b, c)
	for _, frozen := range []bool{false, true} {
		var ds, backs, splits []time.Duration
		missed := 0
		kills := kills
		if frozen {
			kills = frozenKills
		}
		if kills == 0 {
			continue
		}
		for k := range kills {
			s := settle(b, c, ip, 3, mlbSettle, false)
			if s.mac == "" {
				b.Logf("FIGURE metallb_no_steady_mac kill %d (frozen %v): %s not answered by one steady MAC within %v (answers %v); failovers before it %s, missed %d; the rest not measured (load %s)",
					k+1, frozen, ip, mlbSettle, s.seen, spread(ds), missed, loadavg())
				return
			}
			from := macs[s.mac]
			if from == nil {
				b.Fatalf("MetalLB: %s answered by %s, no node's LAN MAC", ip, s.mac)
			}
			thaw := func() {}
			if frozen {
				thaw = c.FreezeAPIServer(b)
			}
			d, to := failoverWithin(b, c, ip, from, s.mac, noTakeover)
			if to == "" {
				missed++
			} else {
				ds = append(ds, d)
			}
			if err := from.PlugLAN(); err != nil {
				b.Fatal(err)
			}
			back := settle(b, c, ip, 5, mlbSettle, false)
			thaw()
			if len(back.splitMACs) > 0 {
				splits = append(splits, back.splitFor)
				b.Logf("metallb kill %d (frozen %v): split brain on return, %s answered by %v at once for %v", k+1, frozen, ip, whereMACs(c, back.splitMACs), back.splitFor.Round(time.Millisecond))
			}
			if back.mac == "" {
				b.Logf("FIGURE metallb_no_steady_mac_after_return kill %d (frozen %v): %s not answered by one steady MAC within %v of %s's return (answers %v); failovers before it %s, missed %d; the rest not measured (load %s)",
					k+1, frozen, ip, mlbSettle, from.Name, back.seen, spread(ds), missed, loadavg())
				return
			}
			backs = append(backs, back.took)
		}
		name := "metallb_failover"
		if frozen {
			name += "_apiserver_frozen"
		}
		b.Logf("FIGURE %s %s, no takeover within 10 s in %d of %d (load %s)", name, spread(ds), missed, kills, loadavg())
		b.Logf("FIGURE %s_return_to_steady_mac %s (load %s)", name, spread(backs), loadavg())
		b.Logf("FIGURE %s_split_brain_on_return in %d of %d returns, two MACs answering for (first to last double answer) %s (load %s)", name, len(splits), kills, spread(splits), loadavg())
	}
}

// mlbSettle bounds the wait for MetalLB to settle on one MAC: its
// speakers rejoin memberlist peers they declared dead once a minute
// (internal/speakerlist), so a split brain may last that long; three
// times that is a failure to heal, reported.
const mlbSettle = 3 * time.Minute

// nodesByMAC maps each node's LAN interface MAC to the node.
func nodesByMAC(b *testing.B, c *kubecluster.Cluster) map[string]*kubecluster.Node {
	b.Helper()
	macs := map[string]*kubecluster.Node{}
	for _, n := range c.Nodes() {
		macs[lanMAC(b, n)] = n
	}
	return macs
}

// whereMACs names the node and interface of each MAC.
func whereMACs(c *kubecluster.Cluster, macs []string) []string {
	var where []string
	for _, m := range macs {
		where = append(where, m+" = "+macOwner(c, m))
	}
	slices.Sort(where)
	return where
}

// recoveryStreak is how many answered probes in a row end a kill's
// recovery in serviceRecovery: with two endpoints and one gone, 20 in a
// row by luck is one chance in a million.
const recoveryStreak = 20

// recovery is what serviceRecovery measured over its kills.
type recovery struct {
	first, every   []time.Duration // from the cable pull to the first answer, and to the first of recoveryStreak in a row
	failed, probes int             // probes that failed after a kill's first answer, of all probes after it
}

// Probes of serviceRecovery: one every probeEvery (or right after the
// last, when it took longer), giving up on a connection after
// probeConnect (a SYN to a pod on the node that left is never answered;
// on the LAN a live one is answered within a millisecond) and on the
// request after 1 s.
const (
	probeEvery   = 100 * time.Millisecond
	probeConnect = 500 * time.Millisecond
)

// serviceRecovery pulls the cable of svc's announcer kills times, and
// each time has the LAN client get http://ip/ (probeEvery) until
// recoveryStreak answers in a row. Before each kill
// every node is Ready and svc has two ready endpoints again, so each kill
// starts where a first one would.
func serviceRecovery(b *testing.B, c *kubecluster.Cluster, f *fixture, svc, ip string, kills int) recovery {
	b.Helper()
	var r recovery
	macs := nodesByMAC(b, c)
	get := lanHTTPWithin(c, ip, probeConnect, time.Second)
	for k := range kills {
		for _, n := range c.Nodes() {
			if err := c.WaitNodeReady(n.Name, wait); err != nil {
				b.Fatal(err)
			}
		}
		if err := kubecluster.Poll(wait, func() error { return readyEndpoints(c, f.ns, svc, 2) }); err != nil {
			b.Fatal(err)
		}
		// One steady MAC: after the last kill's return the address may
		// still move back to the returned node.
		mac, _ := steadyMAC(b, c, ip, 5)
		from := macs[mac]
		if from == nil {
			b.Fatalf("%s answered by no node's LAN MAC", ip)
		}
		b.Cleanup(func() { _ = from.PlugLAN() })
		if err := from.UnplugLAN(); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		var first time.Duration
		streak := 0
		var streakStart time.Duration
		for streak < recoveryStreak {
			if time.Since(start) > wait {
				b.Fatalf("kill %d of %s's announcer %s: %d answers in a row within %v", k+1, svc, from.Name, recoveryStreak, wait)
			}
			at := time.Since(start)
			_, err := get()
			if first > 0 {
				r.probes++
			}
			switch {
			case err != nil && first > 0:
				r.failed++
				streak = 0
			case err != nil:
			default:
				if first == 0 {
					first = at
				}
				if streak == 0 {
					streakStart = at
				}
				streak++
			}
			time.Sleep(time.Until(start.Add(at + probeEvery)))
		}
		r.first = append(r.first, first)
		r.every = append(r.every, streakStart)
		b.Logf("client recovery %s kill %d (%s off the LAN): first answer %v, every answer from %v", svc, k+1, from.Name, first.Round(time.Millisecond), streakStart.Round(time.Millisecond))
		if err := from.PlugLAN(); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// readyEndpoints says whether svc's EndpointSlices hold want ready
// endpoints.
func readyEndpoints(c *kubecluster.Cluster, ns, svc string, want int) error {
	list, err := c.Client().DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return err
	}
	n := 0
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				n++
			}
		}
	}
	if n != want {
		return fmt.Errorf("service %s/%s: %d ready endpoints, want %d", ns, svc, n, want)
	}
	return nil
}

// failoverLoop pulls the cable of ip's announcer kills times (the API
// server frozen for each kill when frozen) and returns the failover times
// and the times from each replug to one steady MAC (5 answers in a row),
// and how many kills saw no takeover within noTakeover.
func failoverLoop(b *testing.B, c *kubecluster.Cluster, ip string, kills int, frozen bool) (failovers, returns []time.Duration, missed int) {
	b.Helper()
	macs := nodesByMAC(b, c)
	var ds []time.Duration
	for k := range kills {
		mac := oneMAC(b, c, ip, "", 3)
		from := macs[mac]
		if from == nil {
			b.Fatalf("%s answered by %s, no node's LAN MAC", ip, mac)
		}
		thaw := func() {}
		if frozen {
			thaw = c.FreezeAPIServer(b)
		}
		d, to := failoverWithin(b, c, ip, from, mac, noTakeover)
		switch {
		case to == "":
			missed++
		case macs[to] == nil:
			b.Fatalf("kill %d: %s answered by %s after %s left: no node's LAN MAC", k, ip, to, from.Name)
		default:
			ds = append(ds, d)
		}
		if err := from.PlugLAN(); err != nil {
			b.Fatal(err)
		}
		_, back := steadyMAC(b, c, ip, 5)
		returns = append(returns, back)
		thaw()
	}
	return ds, returns, missed
}

// spread formats durations as p50, p99, max and count.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	pct := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return fmt.Sprintf("p50=%v p99=%v max=%v n=%d", pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

// agentUsage watches the cluster's villaged processes (those in its nodes'
// cgroups) for d: CPU per agent, VmRSS at the end per agent, and the API
// requests the agents made (audit log, user agent villaged) per minute.
func agentUsage(b *testing.B, c *kubecluster.Cluster, d time.Duration) string {
	b.Helper()
	pids := agentPIDs(b)
	cpu0 := map[int]time.Duration{}
	for _, pid := range pids {
		p, err := testenv.ReadProcCPU(pid)
		if err != nil {
			b.Fatal(err)
		}
		cpu0[pid] = p.Self
	}
	start := time.Now()
	for time.Since(start) < d {
		time.Sleep(time.Second)
	}
	end := time.Now()
	var parts []string
	for _, pid := range pids {
		p, err := testenv.ReadProcCPU(pid)
		if err != nil {
			b.Fatal(err)
		}
		parts = append(parts, fmt.Sprintf("agent[%d] cpu=%.1f%% rss=%s", pid, 100*float64(p.Self-cpu0[pid])/float64(end.Sub(start)), vmRSS(pid)))
	}
	evs, err := c.API().AuditEvents("")
	if err != nil {
		b.Fatal(err)
	}
	// The agent's own client says villaged; its LAN pool store's client
	// (the host credentials of the kubernetes store) says
	// village-ipam-kube, which no LAN pod's ADD uses in this window.
	n := map[string]int{}
	kinds := map[string]int{} // the agent's requests by verb and path, for the figure
	for _, e := range evs {
		if e.Received.Before(start) || !e.Received.Before(end) {
			continue
		}
		for _, ua := range []string{kubenames.Agent, "village-ipam-kube"} {
			if strings.HasPrefix(e.UserAgent, ua) {
				n[ua]++
				path, _, _ := strings.Cut(e.RequestURI, "?")
				kinds[ua+" "+e.Verb+" "+path]++
			}
		}
	}
	mins := end.Sub(start).Minutes()
	parts = append(parts, fmt.Sprintf("api_requests_per_min villaged=%.1f village-ipam-kube(store)=%.1f (both agents)", float64(n[kubenames.Agent])/mins, float64(n["village-ipam-kube"])/mins))
	var top []string
	for k, v := range kinds {
		top = append(top, fmt.Sprintf("%d %s", v, k))
	}
	slices.SortFunc(top, func(a, b string) int {
		var x, y int
		fmt.Sscan(a, &x)
		fmt.Sscan(b, &y)
		return y - x
	})
	if len(top) > 5 {
		top = top[:5]
	}
	parts = append(parts, fmt.Sprintf("most requested: %v", top))
	return strings.Join(parts, " ")
}

// agentPIDs are the villaged processes in a kubecluster node's cgroups.
func agentPIDs(b *testing.B) []int {
	b.Helper()
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "villaged" {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(d, "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/village-kc-") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		b.Fatal("no villaged process in the cluster's cgroups")
	}
	slices.Sort(pids)
	return pids
}

// vmRSS is the process's VmRSS line value ("12345 kB").
func vmRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}

// macOwner names the node and interface that have mac, from every node's
// links, or "unknown".
func macOwner(c *kubecluster.Cluster, mac string) string {
	for _, n := range c.Nodes() {
		out, err := n.Exec("ip", "-o", "link", "show")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "link/ether "+mac+" ") {
				if f := strings.Fields(l); len(f) > 1 {
					return n.Name + " " + strings.TrimSuffix(f[1], ":")
				}
			}
		}
	}
	return "unknown"
}
