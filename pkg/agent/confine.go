package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/village-cni/village/pkg/kubenames"
	"github.com/village-cni/village/pkg/nodelocal"
)

// Confinement: RBAC grants the agent its verbs on every Node and Pod
// (rbac.yaml), and with LAN Services on every Service (lan-services.yaml);
// only the ValidatingAdmissionPolicies (village-agent in admission.yaml,
// village-lan-services beside the grant) narrow them to its own node,
// Village's annotations and the LAN Service ranges.
// Without it (Kubernetes before 1.30, the admission plugin off, the policy
// or its binding deleted) a node's token could rewrite every pod. The agent
// does not take the policy on trust: it proves it is in force by asking for
// a write the policy exists to refuse, and until that is refused it writes
// nothing to the API.
//
// The probe is a dry-run merge patch of a label on its own Node through
// nodes/status: RBAC allows it (nodes/status patch), the status strategy
// keeps labels, and village-agent refuses every label change; dryRun=All
// still runs admission but stores nothing. Only a refusal that names
// village-agent proves confinement: any other answer (allowed, another
// refusal, no answer) leaves the writes shut.

const (
	// ConfinementPolicy is the admission policy whose refusal proves
	// confinement (deploy/kubernetes/admission.yaml).
	ConfinementPolicy = "village-agent"
	// confineProbeLabel is the label the dry-run probe asks to set.
	confineProbeLabel = kubenames.Prefix + "confinement-probe"
	// confineEvery is how often the probe runs again once it has an
	// answer (a deleted policy shuts the writes within it, an installed
	// one opens them); confineRetry is the first pause after a failed
	// probe, doubled up to confineEvery.
	confineEvery = time.Minute
	confineRetry = 2 * time.Second
)

// errNotProbed is the state before the first probe has answered.
var errNotProbed = errors.New("confinement not proved yet: the first probe has not answered")

// confinement is the probe's last verdict: nil when the API server refused
// the probe through village-agent, else why the agent is not (known to be)
// confined. The gate reads it on every write, the readiness probe and the
// status file too.
type confinement struct {
	mu    sync.Mutex
	err   error
	first chan struct{} // closed by the first verdict
}

func newConfinement() *confinement {
	return &confinement{err: errNotProbed, first: make(chan struct{})}
}

// firstWait bounds how long a write made before the first verdict waits
// for it (the registry's first annotations race the first probe).
const firstWait = 15 * time.Second

// await is get after the first verdict, or after ctx or firstWait.
func (c *confinement) await(ctx context.Context) error {
	t := time.NewTimer(firstWait)
	defer t.Stop()
	select {
	case <-c.first:
	case <-ctx.Done():
	case <-t.C:
	}
	return c.get()
}

func (c *confinement) get() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *confinement) set(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
	select {
	case <-c.first:
	default:
		close(c.first)
	}
}

// confineVerdict reads the probe's answer: nil (confined) only for a
// Forbidden from the admission policy ConfinementPolicy.
func confineVerdict(node string, err error) error {
	switch {
	case err == nil:
		return fmt.Errorf("NOT CONFINED: the API server let this agent relabel its own Node %s (a dry run): the ValidatingAdmissionPolicy %s is not in force "+
			"(Kubernetes before 1.30, the ValidatingAdmissionPolicy admission plugin off, or the policy or its binding deleted; apply deploy/kubernetes/admission.yaml); "+
			"no API writes until it is", node, ConfinementPolicy)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+ConfinementPolicy+"'"):
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf("NOT CONFINED (unproven): the dry-run probe on Node %s was refused, but not by the ValidatingAdmissionPolicy %s: %w; no API writes until it is", node, ConfinementPolicy, err)
	default:
		return fmt.Errorf("confinement unknown: the dry-run probe on Node %s: %w; no API writes until it answers", node, err)
	}
}

// probeConfinement asks for the dry-run relabel of node and returns the
// verdict.
func probeConfinement(ctx context.Context, cs kubernetes.Interface, node string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{confineProbeLabel: "probe"}}})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := cs.CoreV1().Nodes().Patch(ctx, node, ktypes.MergePatchType, patch,
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: kubenames.Agent}, "status")
	return confineVerdict(node, err)
}

// keepConfinement probes at once, then again every confineEvery (sooner,
// with backoff, while no probe has proved confinement), until ctx is done.
// Each verdict goes to conf, the log (when it changes) and the status file
// (writeStatus).
func keepConfinement(ctx context.Context, cs kubernetes.Interface, node string, conf *confinement, writeStatus func(error), logf func(string, ...any)) {
	wait, last := confineRetry, ""
	for {
		err := probeConfinement(ctx, cs, node)
		if ctx.Err() != nil {
			return
		}
		conf.set(err)
		writeStatus(err)
		now := "confined: the ValidatingAdmissionPolicy " + ConfinementPolicy + " refused the dry-run probe; API writes allowed"
		if err != nil {
			now = err.Error()
		}
		if now != last {
			logf("%s", now)
			last = now
		}
		next := confineEvery
		if err != nil {
			next, wait = wait, min(2*wait, confineEvery)
		} else {
			wait = confineRetry
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}

// writeGate is the agent's API transport: reads always pass, a write (any
// method but GET, HEAD, OPTIONS) passes only while the agent is confined,
// or when it is a dry run (the probe itself). Every client of the agent's
// one kubeAPI goes through it: the registry's annotations, the LAN pods'
// and Services' patches, the Events, the host credentials' TokenRequests.
type writeGate struct {
	next http.RoundTripper
	conf *confinement
}

func (g writeGate) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return g.next.RoundTrip(req)
	}
	if req.URL.Query().Get("dryRun") == metav1.DryRunAll {
		return g.next.RoundTrip(req)
	}
	if err := g.conf.await(req.Context()); err != nil {
		return nil, fmt.Errorf("%s %s not sent: %w", req.Method, req.URL.Path, err)
	}
	return g.next.RoundTrip(req)
}

// ConfinementStatus is the confinement status file's content, read by
// `villaged status`.
type ConfinementStatus struct {
	Confined bool      `json:"confined"`
	Reason   string    `json:"reason,omitempty"`
	Time     time.Time `json:"time"`
}

// writeConfinementStatus records a verdict in network's status file.
func writeConfinementStatus(runDir, network string, err error) error {
	st := ConfinementStatus{Confined: err == nil, Time: time.Now().UTC()}
	if err != nil {
		st.Reason = err.Error()
	}
	b, _ := json.Marshal(st)
	return nodelocal.WriteFile(nodelocal.ConfinementStatus(runDir, network), b, 0o644)
}

// confinementStatus is `villaged status`'s line about confinement (nil
// when the agent does not use the API), and whether it is clean.
func confinementStatus(runDir, network string, usesAPI bool) (lines []string, ok bool) {
	if !usesAPI {
		return nil, true
	}
	var st ConfinementStatus
	found, err := nodelocal.ReadJSON(nodelocal.ConfinementStatus(runDir, network), &st)
	switch {
	case err != nil:
		return []string{"API confinement: unknown: " + err.Error()}, false
	case !found:
		return []string{"API confinement: unknown (no probe yet: is `villaged run` running?)"}, false
	case !st.Confined:
		return []string{fmt.Sprintf("API confinement: %s (as of %s)", st.Reason, st.Time.Format("15:04:05"))}, false
	}
	return []string{fmt.Sprintf("API confinement: ok: the ValidatingAdmissionPolicy %s refused the dry-run probe (as of %s)", ConfinementPolicy, st.Time.Format("15:04:05"))}, true
}
