package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/agentsock"
	"github.com/village-cni/village/pkg/nodelocal"
	"github.com/village-cni/village/pkg/village"
)

// lanAnswer is an agent's answer on the real socket server: every pod asks
// for the LAN (what pkg/agent decides is tested there and in test/kube).
type lanAnswer struct{}

func (lanAnswer) LANPod(context.Context, string, agentsock.Pod) (agentsock.LAN, error) {
	return agentsock.LAN{Want: true}, nil
}
func (lanAnswer) LANReport(context.Context, string, agentsock.Pod, agentsock.Report) error {
	return nil
}
func (lanAnswer) LANList(context.Context) ([]agentsock.LANPod, error) { return nil, nil }
func (lanAnswer) DHCP(context.Context, agentsock.DHCPRequest) (agentsock.DHCPResponse, error) {
	return agentsock.DHCPResponse{}, nil
}

// TestAnnotatedADDWaitsForTheAgent: pods "annotated", a Kubernetes pod's
// ADD through the real plugin on a node whose agent is not up yet (a node
// booting). With no agent within the bound it fails with code 11 after
// the bound (not at once, as before), its message carrying the plugin's
// marker and naming the socket and the wait; an ADD started before the
// agent comes up waits for it and gets net1 (which of the two comes first
// is not forced: the bound case is the one that tells the wait).
func TestAnnotatedADDWaitsForTheAgent(t *testing.T) {
	lan := NewLAN(t)
	n := NewNode(t)
	lan.Attach(t, n.NS, "lan0", "192.168.77.10/24")
	runDir := filepath.Join(n.Dir, "run")
	wait := "1s"
	withWait := func(wait string) {
		withPluginEnv(t, n, nodelocal.RunDirEnv+"="+runDir, nodelocal.AgentWaitEnv+"="+wait)
	}
	withWait(wait)
	conf := strings.Replace(lanList(n, "agentwait", "10.53.1.0/24", "192.168.77.200", "192.168.77.203", ""),
		`"hostShim":true,`, `"hostShim":true,"pods":"annotated",`, 1)
	l := ConfList(t, conf)

	// No agent within the bound.
	early := n.NewPod()
	start := time.Now()
	_, err := addArgs(n, l, early, k8sPodArgs(early)...)
	if took := time.Since(start); took < time.Second {
		t.Errorf("ADD with no agent failed after %s, before the bound %s: it did not wait", took, wait)
	}
	m, ok := village.ParseError(errString(err))
	if err == nil || cniCode(err) != 11 || !ok || m.Plugin != village.Plugin || m.Code != 11 ||
		!strings.Contains(err.Error(), agentsock.Path(runDir)) || !strings.Contains(err.Error(), "waited") {
		t.Errorf("ADD with no agent: %v (code %d, marker %+v %v), want code 11 with the marker, naming %s and the wait", err, cniCode(err), m, ok, agentsock.Path(runDir))
	}

	// The agent comes up while the ADD waits.
	withWait("2m")
	p := n.NewPod()
	done := addAsync(n, l, p, k8sPodArgs(p)...)
	ln, err := agentsock.Listen(agentsock.Path(runDir))
	must(t, err, "the agent's socket")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); agentsock.Serve(ctx, ln, lanAnswer{}, t.Logf) }()
	t.Cleanup(func() { cancel(); <-served })
	a := <-done
	must(t, a.err, "ADD started before the agent")
	if ip := lanIP(t, a.r); !strings.HasPrefix(ip, "192.168.77.20") {
		t.Fatalf("LAN address %q after the wait, want one of the pool", ip)
	}
}

// withPluginEnv has n's plugins run with env added to the runtime's.
func withPluginEnv(t testing.TB, n *Node, env ...string) {
	n.CNI = libcni.NewCNIConfigWithCacheDir(filepath.SplitList(testenv.CNIPath(t)), filepath.Join(n.Dir, "cache"),
		envExec{Exec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}, env: env})
}

// k8sPodArgs is the CNI_ARGS a Kubernetes runtime passes for pod p (in
// namespace "ns", named after its container ID).
func k8sPodArgs(p *Pod) [][2]string {
	return [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "pod-" + p.ID[:8]}, {"K8S_POD_UID", "uid-" + p.ID[:8]}}
}

// addAnswer is the outcome of an ADD started by addAsync.
type addAnswer struct {
	r   *current.Result
	err error
}

// addAsync starts an ADD of p with CNI_ARGS args; its outcome comes on the
// channel returned.
func addAsync(n *Node, l *libcni.NetworkConfigList, p *Pod, args ...[2]string) <-chan addAnswer {
	done := make(chan addAnswer, 1)
	go func() {
		r, err := addArgs(n, l, p, args...)
		done <- addAnswer{r, err}
	}()
	return done
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
