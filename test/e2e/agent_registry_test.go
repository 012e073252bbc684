package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/agent"
	"github.com/village-cni/village/pkg/overlay"
)

// The registry scenario: a namespace LAN, etcd in a "LAN host" namespace on
// it, three node namespaces each running the real `villaged run` binary
// with one identical conflist that names no pod range, so every node leases
// its subnet from clusterCIDR.

const (
	agentLANPrefix = "192.168.79."
	agentEtcdIP    = "192.168.79.5"
	agentCluster   = "10.70.0.0/16"
	agentTTL       = 5
)

// envExec runs plugins with extra environment: here VILLAGE_RUN_DIR, so
// that each test node's village-ipam reads the subnet its own villaged
// published (on a real node it is /run/village, one per machine).
type envExec struct {
	invoke.Exec
	env []string
}

func (e envExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	return e.Exec.ExecPlugin(ctx, path, stdin, append(environ, e.env...))
}

type agentNode struct {
	*Node
	name, ip string
	runDir   string
	log      *lockedBuffer
	cmd      *exec.Cmd
	exited   chan error
	// env is added to the environment of every villaged run here: in the
	// kubernetes labs, the node's own API credential (kubetest.AgentOn).
	env []string
	// wrap runs before villaged inside the node, as `wrap... villaged
	// args...` (nil: villaged directly): the wireguard lab's private mounts.
	wrap []string
	// conf is this node's own conflist ("": the lab's).
	conf string
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runVillaged starts the real `villaged run` for network conf inside node
// n, as node name, with its run dir under n.Dir and the given repair
// period. It returns the process's output and stop, which sends SIGTERM and
// waits for the exit (once; it also runs when the test ends, and then
// prints the output of a failed test).
func runVillaged(t *testing.T, n *Node, conf, name, period string) (log *lockedBuffer, stop func()) {
	t.Helper()
	log = &lockedBuffer{}
	cmd := exec.Command("ip", "netns", "exec", n.Name(), filepath.Join(testenv.Bins(t), "villaged"),
		"run", "--conf", conf, "--node-name", name, "--run-dir", filepath.Join(n.Dir, "run"), "--period", period, "--safety-net", period)
	cmd.Stdout, cmd.Stderr = log, log
	must(t, cmd.Start(), "starting villaged")
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("villaged log:\n%s", log.String())
		}
	})
	return log, stop
}

type agentLab struct {
	t     *testing.T
	host  ns.NetNS // the LAN host etcd (or the API server) listens in
	lan   *LAN
	etcd  *etcdtest.Server
	conf  string // the one conflist every node uses
	list  *libcni.NetworkConfigList
	nodes []*agentNode
	// period is the agents' --period ("": villaged's default).
	period string
}

// agentConflist is the lab's conflist; extra[0] is added to the registry
// section, extra[1] to the village entry.
func agentConflist(mode, dataDir string, extra ...string) string {
	extra = append(extra, "", "")
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"agt","plugins":[{"type":"village","bridge":"village0","isDefaultGateway":true,
		"ipMasq":true,"clusterCIDR":%q,
		"ipam":{"type":"village-ipam","dataDir":%q},
		"backend":{"type":%q,"underlay":"lan0","vni":9,
			"registry":{"type":"etcd","endpoints":["http://%s:2379"],"prefix":"/village","ttl":%d%s}}%s}]}`,
		agentCluster, dataDir, mode, agentEtcdIP, agentTTL, extra[0], extra[1])
}

func newAgentLab(t *testing.T, mode string, extra ...string) *agentLab {
	t.Helper()
	return newEtcdLabOf(t, 3, func(dataDir string) string { return agentConflist(mode, dataDir, extra...) })
}

// newEtcdLabOf is a lab with the etcd registry on its LAN and count nodes
// (not started), the conflist made by conflist (see setup).
func newEtcdLabOf(t *testing.T, count int, conflist func(dataDir string) string) *agentLab {
	t.Helper()
	lan := NewLAN(t)
	host := testenv.NewNS(t)
	lan.Attach(t, host, "eth0", agentEtcdIP+"/24")
	lab := &agentLab{t: t, host: host, etcd: etcdtest.StartIn(t, host, agentEtcdIP)}
	lab.setup(lan, conflist, count)
	return lab
}

// setup writes the one conflist (made by conflist from the IPAM data
// directory) and attaches count node namespaces to the LAN, stopping their
// agents when the test ends.
func (lab *agentLab) setup(lan *LAN, conflist func(dataDir string) string, count int) {
	t := lab.t
	dir := t.TempDir()
	lab.conf = filepath.Join(dir, "10-agt.conflist")
	text := conflist(filepath.Join(dir, "ipam"))
	must(t, os.WriteFile(lab.conf, []byte(text), 0o644), "writing the conflist")
	lab.list = ConfList(t, text)
	lab.lan = lan
	for range count {
		lab.addNode()
	}
	t.Cleanup(func() {
		for _, n := range lab.nodes {
			if t.Failed() && os.Getenv("VILLAGE_DEBUG_QUIT") != "" {
				n.stop(t, syscall.SIGQUIT)
			}
			n.stop(t, syscall.SIGTERM)
			if t.Failed() {
				t.Logf("villaged log of %s:\n%s", n.name, n.log.String())
			}
		}
	})
}

// addNode attaches one more node namespace (nodeN, LAN address .1N) to the
// LAN; its agent is not started.
func (lab *agentLab) addNode() *agentNode {
	return lab.addNodeOn(lab.lan, agentLANPrefix, 24)
}

// addNodeOn attaches one more node namespace (nodeN, address
// <prefix>1N/bits) to lan; its agent is not started.
func (lab *agentLab) addNodeOn(lan *LAN, prefix string, bits int) *agentNode {
	t := lab.t
	i := len(lab.nodes) + 1
	n := &agentNode{Node: NewNode(t), name: fmt.Sprintf("node%d", i), ip: fmt.Sprintf("%s1%d", prefix, i)}
	lan.Attach(t, n.NS, "lan0", fmt.Sprintf("%s/%d", n.ip, bits))
	n.runDir = filepath.Join(n.Dir, "run")
	n.CNI = libcni.NewCNIConfigWithCacheDir(filepath.SplitList(testenv.CNIPath(t)), filepath.Join(n.Dir, "cache"),
		envExec{Exec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}},
			env: []string{"VILLAGE_RUN_DIR=" + n.runDir}})
	n.log = &lockedBuffer{}
	lab.nodes = append(lab.nodes, n)
	return n
}

// villaged is the command line of the real binary inside node n.
func (n *agentNode) villaged(t *testing.T, args ...string) *exec.Cmd {
	full := append(append(append([]string{"netns", "exec", n.Name()}, n.wrap...), filepath.Join(testenv.Bins(t), "villaged")), args...)
	cmd := exec.Command("ip", full...)
	if len(n.env) > 0 {
		cmd.Env = append(os.Environ(), n.env...)
	}
	return cmd
}

func (lab *agentLab) start(n *agentNode) {
	t := lab.t
	t.Helper()
	if n.cmd != nil {
		t.Fatalf("villaged already runs on %s", n.name)
	}
	conf := lab.conf
	if n.conf != "" {
		conf = n.conf
	}
	args := append([]string{"run", "--conf", conf, "--node-name", n.name, "--run-dir", n.runDir}, lab.periodArgs()...)
	cmd := n.villaged(t, args...)
	cmd.Stdout, cmd.Stderr = n.log, n.log
	must(t, cmd.Start(), "starting villaged on %s", n.name)
	n.cmd, n.exited = cmd, make(chan error, 1)
	go func() { n.exited <- cmd.Wait() }()
}

// periodArgs are the agents' --period and --safety-net: both the lab's
// period (villaged's default period when it has none), so that a test
// that waits for a full pass waits one period, as before the safety net.
func (lab *agentLab) periodArgs() []string {
	p := lab.period
	if p == "" {
		p = agent.DefaultPeriod.String()
	}
	return []string{"--period", p, "--safety-net", p}
}

// stop signals the agent and waits for it; SIGKILL after 10 s.
func (n *agentNode) stop(t *testing.T, sig syscall.Signal) error {
	if n.cmd == nil {
		return nil
	}
	_ = n.cmd.Process.Signal(sig)
	var err error
	select {
	case err = <-n.exited:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		err = fmt.Errorf("villaged on %s did not stop within 10s of %v", n.name, sig)
		<-n.exited
	}
	n.cmd = nil
	return err
}

// waitFor polls cond every 50 ms until it holds, and returns how long that
// took; it fails the test (or benchmark) after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	began := time.Now()
	last := ""
	for time.Since(began) < within {
		ok, state := cond()
		if ok {
			return time.Since(began)
		}
		last = state
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last state:\n%s", what, within, last)
	return 0
}

func (n *agentNode) subnet(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(n.runDir, "agt", "subnet"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			return line
		}
	}
	return ""
}

func (n *agentNode) routes(t *testing.T) string {
	out, _ := testenv.IP(n.NS, "route", "show", "proto", "86")
	return out
}

// hasRoutes: n has a route to every subnet in want and to none in gone.
func (n *agentNode) hasRoutes(t *testing.T, want, gone []string) (bool, string) {
	r := n.routes(t)
	for _, s := range want {
		if !strings.Contains(r, s+" ") {
			return false, r
		}
	}
	for _, s := range gone {
		if strings.Contains(r, s+" ") {
			return false, r
		}
	}
	return true, r
}

func (lab *agentLab) startAll() []string {
	t := lab.t
	for _, n := range lab.nodes {
		lab.start(n)
	}
	var subnets []string
	for _, n := range lab.nodes {
		waitFor(t, 20*time.Second, n.name+" publishes its leased subnet", func() (bool, string) {
			return n.subnet(t) != "", n.log.String()
		})
		subnets = append(subnets, n.subnet(t))
	}
	if len(slices.Compact(slices.Sorted(slices.Values(subnets)))) != 3 {
		t.Fatalf("leased subnets are not distinct: %v", subnets)
	}
	for _, s := range subnets {
		if !regexp.MustCompile(`^10\.70\.\d+\.0/24$`).MatchString(s) {
			t.Fatalf("leased subnet %s is not a /24 of %s", s, agentCluster)
		}
	}
	for i, n := range lab.nodes {
		others := slices.Delete(slices.Clone(subnets), i, i+1)
		waitFor(t, 20*time.Second, n.name+" has routes to the other nodes", func() (bool, string) {
			return n.hasRoutes(t, others, nil)
		})
	}
	return subnets
}

// podsPing adds one pod per node with the shared conflist and pings every
// address of every pod (each family it has) from every other.
func (lab *agentLab) podsPing(subnets []string) []*Pod {
	t := lab.t
	var pods []*Pod
	var addrs [][]string
	for i, n := range lab.nodes {
		p := n.NewPod()
		r := n.MustAdd(lab.list, p)
		a := r.IPs[0].Address
		if !strings.HasPrefix(a.String(), strings.TrimSuffix(subnets[i], "0/24")) {
			t.Fatalf("pod on %s got %s, outside the node's leased %s", n.name, a.String(), subnets[i])
		}
		pods = append(pods, p)
		var own []string
		for _, ip := range r.IPs {
			own = append(own, ip.Address.IP.String())
		}
		addrs = append(addrs, own)
	}
	// The first packets between two nodes may meet no session yet (a
	// WireGuard peer added quietly, see pkg/wireguard): wait for each pair
	// to connect, then it must answer every ping.
	for i := range pods {
		for j := range pods {
			if i == j {
				continue
			}
			for _, to := range addrs[j] {
				what := fmt.Sprintf("pod on %s -> pod on %s (%s)", lab.nodes[i].name, lab.nodes[j].name, to)
				waitFor(t, 20*time.Second, what, func() (bool, string) {
					err := testenv.Ping(pods[i].NS, to, 1)
					return err == nil, fmt.Sprint(err)
				})
				must(t, testenv.Ping(pods[i].NS, to, 2), "%s", what)
			}
		}
	}
	return pods
}

func TestAgentRegistryCluster(t *testing.T) {
	for _, mode := range []string{"vxlan", "host-gw"} {
		t.Run(mode, func(t *testing.T) {
			lab := newAgentLab(t, mode)
			subnets := lab.startAll()
			pods := lab.podsPing(subnets)
			if mode == "vxlan" {
				lab.repairAndStatus(subnets)
				lab.masqRepair()
			}
			lab.underlayMoves(pods)
			lab.deadNodeDisappears(subnets)
		})
	}
}

// repairAndStatus: a route (and a neighbour entry) deleted by hand comes
// back; with the agent stopped (SIGTERM: routes stay) status names the
// missing route and fails; a restarted agent keeps its subnet and repairs,
// and status is clean again.
func (lab *agentLab) repairAndStatus(subnets []string) {
	t := lab.t
	n1 := lab.nodes[0]
	testenv.MustIP(t, n1.NS, "route", "del", subnets[1])
	d := waitFor(t, 20*time.Second, "the route deleted by hand comes back", func() (bool, string) {
		return n1.hasRoutes(t, subnets[1:], nil)
	})
	t.Logf("FIGURE: a route deleted by hand came back after %s", d.Round(time.Millisecond))
	vtep2 := strings.TrimSuffix(subnets[1], "/24")
	testenv.MustIP(t, n1.NS, "neigh", "del", vtep2, "dev", "village.9")
	d = waitFor(t, 20*time.Second, "the neighbour entry deleted by hand comes back", func() (bool, string) {
		out, _ := testenv.IP(n1.NS, "neigh", "show", "dev", "village.9")
		return strings.Contains(out, vtep2+" lladdr") && strings.Contains(out, "PERMANENT"), out
	})
	t.Logf("FIGURE: a neighbour entry deleted by hand came back after %s", d.Round(time.Millisecond))

	// The agent serves its metrics and health on the node's loopback; the
	// repairs above show up as drift found and repaired.
	waitFor(t, 20*time.Second, "/metrics counts the repairs and /healthz is ok", func() (bool, string) {
		body, code := httpGetIn(t, n1.NS, "http://127.0.0.1:9696/metrics")
		health, hcode := httpGetIn(t, n1.NS, "http://127.0.0.1:9696/healthz")
		ok := code == 200 && hcode == 200 && strings.Contains(body, "village_peers 2") &&
			metricAtLeast(body, "village_drift_repaired_total", 2) && metricAtLeast(body, "village_reconcile_runs_total", 2) &&
			metricAtLeast(body, "village_lease_renewals_total", 1)
		return ok, fmt.Sprintf("healthz %d %s\n%s", hcode, health, body)
	})

	// A route changed by hand sends no deletion, only the changed route
	// (RTM_NEWROUTE): the agent compares it with its plan and puts it
	// right.
	vtep3 := strings.TrimSuffix(subnets[2], "/24")
	testenv.MustIP(t, n1.NS, "route", "change", subnets[1], "via", vtep3, "dev", "village.9", "onlink", "proto", "86",
		"metric", fmt.Sprint(overlay.Metric("agt")))
	d = waitFor(t, 20*time.Second, "the route changed by hand is corrected", func() (bool, string) {
		r := n1.routes(t)
		return strings.Contains(r, subnets[1]+" via "+vtep2+" "), r
	})
	t.Logf("FIGURE: a route changed by hand was corrected after %s (period 10s)", d.Round(time.Millisecond))

	// SIGTERM: a clean stop, routes stay.
	must(t, n1.stop(t, syscall.SIGTERM), "villaged on %s after SIGTERM", n1.name)
	if ok, r := n1.hasRoutes(t, subnets[1:], nil); !ok {
		t.Fatalf("routes gone after a clean stop: %s", r)
	}
	if !strings.Contains(n1.log.String(), "routes stay") {
		t.Fatalf("no clean-stop message in the log:\n%s", n1.log.String())
	}
	testenv.MustIP(t, n1.NS, "route", "del", subnets[2])
	out, err := n1.villaged(t, "status", "--conf", lab.conf, "--node-name", n1.name, "--run-dir", n1.runDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "missing route "+subnets[2]) || !strings.Contains(string(out), "node3") {
		t.Fatalf("status while drifted: %v\n%s\nwant a failure naming the missing route %s of node3", err, out, subnets[2])
	}
	t.Logf("status while drifted:\n%s", out)

	// Restart: same subnet (the published file and the registry agree),
	// the route comes back, status is clean.
	lab.start(n1)
	waitFor(t, 20*time.Second, "the restarted agent repairs", func() (bool, string) {
		return n1.hasRoutes(t, subnets[1:], nil)
	})
	if got := n1.subnet(t); got != subnets[0] {
		t.Fatalf("subnet changed across a restart: %s, was %s", got, subnets[0])
	}
	if !strings.Contains(n1.log.String(), "holds pod subnet "+subnets[0]) {
		t.Fatalf("restarted agent did not report its held subnet %s:\n%s", subnets[0], n1.log.String())
	}
	waitFor(t, 20*time.Second, "status is clean after the repair", func() (bool, string) {
		out, err := n1.villaged(t, "status", "--conf", lab.conf, "--node-name", n1.name, "--run-dir", n1.runDir).CombinedOutput()
		return err == nil && strings.Contains(string(out), "status: in sync"), string(out)
	})
}

// underlayMoves: node2's underlay address changes; its agent registers the
// new one and the others follow (VXLAN destination or host-gw next hop),
// and pods still reach each other.
func (lab *agentLab) underlayMoves(pods []*Pod) {
	t := lab.t
	n2 := lab.nodes[1]
	newIP := agentLANPrefix + "22"
	testenv.MustIP(t, n2.NS, "addr", "del", n2.ip+"/24", "dev", "lan0")
	testenv.MustIP(t, n2.NS, "addr", "add", newIP+"/24", "dev", "lan0")
	n2.ip = newIP
	d := waitFor(t, 30*time.Second, "node1 follows node2's new underlay address", func() (bool, string) {
		r := lab.nodes[0].routes(t)
		if strings.Contains(r, "via "+newIP) {
			return true, r
		}
		out, _ := exec.Command("ip", "netns", "exec", lab.nodes[0].Name(), "bridge", "fdb", "show", "dev", "village.9").CombinedOutput()
		return strings.Contains(string(out), "dst "+newIP+" "), r + string(out)
	})
	t.Logf("FIGURE: peers followed a changed underlay address after %s", d.Round(time.Millisecond))
	if !strings.Contains(n2.log.String(), "underlay address changed") {
		t.Fatalf("node2's agent did not report the address change:\n%s", n2.log.String())
	}
	addr := strings.Fields(testenv.MustIP(t, pods[1].NS, "-4", "-o", "addr", "show", "dev", "eth0"))[3]
	dst := strings.Split(addr, "/")[0]
	waitFor(t, 10*time.Second, "pod on node1 reaches the pod on node2 after the move", func() (bool, string) {
		err := testenv.Ping(pods[0].NS, dst, 1)
		return err == nil, fmt.Sprint(err)
	})
}

// masqRepair: the masquerade rule set flushed by hand (`nft flush ruleset`,
// the nftables backend being the automatic choice on this host) is restored
// by the periodic pass.
func (lab *agentLab) masqRepair() {
	t := lab.t
	n2 := lab.nodes[1]
	has := func() (bool, string) {
		out, _ := exec.Command("ip", "netns", "exec", n2.Name(), "nft", "list", "ruleset").CombinedOutput()
		return strings.Contains(string(out), `masquerade comment "village:agt"`), string(out)
	}
	if ok, out := has(); !ok {
		t.Fatalf("no masquerade rule on %s: %s", n2.name, out)
	}
	inNS(t, n2.NS, "nft", "flush", "ruleset")
	d := waitFor(t, 25*time.Second, "the flushed masquerade rule set comes back", has)
	t.Logf("FIGURE: a flushed masquerade rule set came back after %s (period 10s)", d.Round(time.Millisecond))
}

// deadNodeDisappears: SIGKILL node3's agent; after its lease TTL its
// routes are gone from node1 and node2, and its record from etcd.
func (lab *agentLab) deadNodeDisappears(subnets []string) {
	t := lab.t
	n3 := lab.nodes[2]
	_ = n3.stop(t, syscall.SIGKILL)
	killed := time.Now()
	for _, n := range lab.nodes[:2] {
		waitFor(t, time.Duration(agentTTL)*time.Second+10*time.Second, n.name+" drops the dead node's routes", func() (bool, string) {
			return n.hasRoutes(t, nil, []string{subnets[2]})
		})
	}
	t.Logf("FIGURE: a SIGKILLed node's routes vanished from both peers %s after the kill (lease TTL %ds)", time.Since(killed).Round(time.Millisecond), agentTTL)
	// The others still reach each other, and still route to each other.
	if ok, r := lab.nodes[0].hasRoutes(t, []string{subnets[1]}, nil); !ok {
		t.Fatalf("node1 lost its route to node2: %s", r)
	}
	// The dead node's subnet lease stays (no TTL): it keeps it when back.
	cli := lab.etcd.ClientIn(t, lab.host)
	resp, err := cli.Get(context.Background(), "/village/subnets/agt/"+subnets[2])
	must(t, err, "reading node3's subnet lease")
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "node3" {
		t.Fatalf("node3's subnet lease: %v", resp.Kvs)
	}
	resp, err = cli.Get(context.Background(), "/village/nodes/agt/node3")
	must(t, err, "reading node3's record")
	if len(resp.Kvs) != 0 {
		t.Fatalf("node3's record outlived its lease: %s", resp.Kvs[0].Value)
	}
	lab.start(n3)
	waitFor(t, 20*time.Second, "node3 is back with the same subnet", func() (bool, string) {
		return lab.nodes[0].hasRoutes(t, []string{subnets[2]}, nil)
	})
}

// With no range in the config and nothing published yet (villaged not
// back after a reboot, the conflist still on disk), STATUS says not ready
// (code 50) and ADD waits for the subnet file: published meanwhile, the
// ADD succeeds from it; never published, it says so with code 11 (try
// again later) after its bound.
func TestAgentIPAMWaitsForLease(t *testing.T) {
	n := NewNode(t)
	run := filepath.Join(n.Dir, "run")
	stdin, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "agt", "type": "village-ipam",
		"ipam": map[string]any{"type": "village-ipam", "dataDir": filepath.Join(n.Dir, "ipam")}})
	call := func(command, id string, env ...string) testenv.Output {
		return n.Exec(testenv.Call{Bin: "village-ipam", Command: command, ContainerID: id, IfName: "eth0", Netns: "/x",
			Stdin: stdin, Env: append([]string{"VILLAGE_RUN_DIR=" + run}, env...)})
	}
	e := CNIError(t, call("ADD", "c1", "VILLAGE_IPAM_LEASE_WAIT=1s"))
	if e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, "villaged has not leased one yet (is `villaged run` running?)") {
		t.Fatalf("ADD before a lease: code %d %q, want code 11 saying villaged has not leased", e.Code, e.Msg)
	}
	e = CNIError(t, call("STATUS", ""))
	if e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "villaged has not leased one yet") {
		t.Fatalf("STATUS before a lease: code %d %q, want code 50 saying villaged has not leased", e.Code, e.Msg)
	}
	// An ADD with the default bound, the file published while it waits.
	done := make(chan testenv.Output, 1)
	go func() { done <- call("ADD", "c2") }()
	select {
	case out := <-done:
		t.Fatalf("ADD returned before the lease was published: exit %d, %s", out.ExitCode, out.Stdout)
	case <-time.After(time.Second):
	}
	must(t, os.MkdirAll(filepath.Join(run, "agt"), 0o755), "run dir")
	must(t, os.WriteFile(filepath.Join(run, "agt", "subnet"), []byte("10.99.3.0/24\n"), 0o644), "publishing the subnet")
	out := <-done
	if out.ExitCode != 0 || !strings.Contains(string(out.Stdout), `"10.99.3.`) {
		t.Fatalf("ADD waiting for the lease: exit %d, %s %s; want an address of 10.99.3.0/24", out.ExitCode, out.Stdout, out.Stderr)
	}
	if out := call("STATUS", ""); out.ExitCode != 0 {
		t.Fatalf("STATUS after the lease: exit %d, %s", out.ExitCode, out.Stdout)
	}
}

// `villaged sync` with static peers does one pass and exits; a second pass
// changes nothing; a peer removed from the list is removed; status agrees.
func TestAgentSyncStaticPeers(t *testing.T) {
	nodes := staticCluster(t)
	n1 := nodes[0]
	conf := filepath.Join(n1.Dir, "static.conflist")
	write := func(peers []*clusterNode) {
		must(t, os.WriteFile(conf, n1.list(t, "vxlan", peers, "").Bytes, 0o644), "conflist")
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", n1.Name(), filepath.Join(testenv.Bins(t), "villaged")}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	write(nodes)
	out, err := run("status", "--conf", conf, "--node-name", "node-"+n1.ip)
	if err == nil || !strings.Contains(out, "missing route 10.60.2.0/24") {
		t.Fatalf("status before any sync: %v\n%s", err, out)
	}
	out, err = run("sync", "--conf", conf, "--node-name", "node-"+n1.ip)
	must(t, err, "sync: %s", out)
	for _, want := range []string{"add route 10.60.2.0/24", "add route 10.60.3.0/24", "add fdb", "add neigh"} {
		if !strings.Contains(out, want) {
			t.Fatalf("sync output lacks %q:\n%s", want, out)
		}
	}
	if r := testenv.MustIP(t, n1.NS, "route", "show", "proto", "86"); !strings.Contains(r, "10.60.2.0/24") || !strings.Contains(r, "10.60.3.0/24") {
		t.Fatalf("routes after sync: %s", r)
	}
	out, err = run("sync", "--conf", conf, "--node-name", "node-"+n1.ip)
	if err != nil || !strings.Contains(out, "(0 changes)") {
		t.Fatalf("second sync: %v\n%s", err, out)
	}
	out, err = run("status", "--conf", conf, "--node-name", "node-"+n1.ip)
	if err != nil || !strings.Contains(out, "status: in sync") {
		t.Fatalf("status after sync: %v\n%s", err, out)
	}
	write(nodes[:2])
	out, err = run("sync", "--conf", conf, "--node-name", "node-"+n1.ip)
	must(t, err, "sync without node 3: %s", out)
	if r := testenv.MustIP(t, n1.NS, "route", "show", "proto", "86"); strings.Contains(r, "10.60.3.0/24") || !strings.Contains(r, "10.60.2.0/24") {
		t.Fatalf("after node 3 left the list: %s", r)
	}
	if out, err := run("sync", "--conf", filepath.Join(n1.Dir, "missing.conflist")); err == nil || !strings.Contains(out, "missing.conflist") {
		t.Fatalf("sync with a missing file: %v %s", err, out)
	}
}

// httpGetIn fetches url with the TCP connection made from inside n.
func httpGetIn(t *testing.T, n ns.NetNS, url string) (string, int) {
	t.Helper()
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dialIn(n)}}
	resp, err := client.Get(url)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// metricAtLeast reports whether the exposition body has name >= min.
func metricAtLeast(body, name string, min float64) bool {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && f >= min
		}
	}
	return false
}
