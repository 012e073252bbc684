package nodelocal

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// After a reboot the run directory is empty and the conflist on disk
// already says the node can network pods: the runtime sends ADDs before
// villaged is back. What an ADD needs from the agent (its answer on the
// agent socket, its published node name) is waited for, boundedly, as
// village-ipam waits for the subnet lease (pkg/ipam/plugin leasewait.go),
// so that no sandbox fails while the node boots.

// DefaultAgentWait bounds how long an ADD waits for the node's agent: its
// socket to answer, its node name to be published.
const DefaultAgentWait = 60 * time.Second

// AgentWaitEnv overrides DefaultAgentWait (a Go duration such as "2s").
// Meant for tests; runtimes do not set it.
const AgentWaitEnv = "VILLAGE_AGENT_WAIT"

// AgentPoll is how often a wait for the agent looks again.
const AgentPoll = 100 * time.Millisecond

// AgentWait is the bound of a wait for the agent: $VILLAGE_AGENT_WAIT, else
// DefaultAgentWait.
func AgentWait() (time.Duration, error) {
	v := os.Getenv(AgentWaitEnv)
	if v == "" {
		return DefaultAgentWait, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s=%q is not a duration such as 2s", AgentWaitEnv, v)
	}
	return d, nil
}

// ErrNodeNameNotPublished: a Kubernetes pod's ADD found no node name the
// agent published, nor $NODE_NAME, within AgentWait.
var ErrNodeNameNotPublished = errors.New("the node's agent (villaged run) has not published its node name")

// KubernetesADD reports whether this process is a CNI ADD for a Kubernetes
// pod: CNI_COMMAND is ADD and CNI_ARGS names the pod (K8S_POD_NAME), as
// the kubelet's runtime passes it. Such an ADD runs on a node whose agent
// publishes the node name; it never guesses one.
func KubernetesADD() bool {
	if os.Getenv("CNI_COMMAND") != "ADD" {
		return false
	}
	for _, kv := range strings.Split(os.Getenv("CNI_ARGS"), ";") {
		if v, ok := strings.CutPrefix(kv, "K8S_POD_NAME="); ok && v != "" {
			return true
		}
	}
	return false
}

// waitNodeName polls NodeNameFile until the agent publishes a name, within
// AgentWait; at the bound, an error wrapping ErrNodeNameNotPublished that
// names the file and the bound.
func waitNodeName(network string) (string, error) {
	bound, err := AgentWait()
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(bound)
	for {
		n, err := publishedNodeName(network)
		if err != nil || n != "" {
			return n, err
		}
		if !time.Now().Before(deadline) {
			return "", fmt.Errorf("%w in %s within %s (%s; the bound is $%s): a Kubernetes pod's address is recorded under the agent's node name, never the host name's guess",
				ErrNodeNameNotPublished, NodeNameFile("", network), bound, "is the village DaemonSet's agent running on this node?", AgentWaitEnv)
		}
		time.Sleep(AgentPoll)
	}
}

// waitFile polls until path exists, within AgentWait; at the bound, the
// last error, which names the path and the bound.
func waitFile(path string) error {
	bound, err := AgentWait()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(bound)
	for {
		_, err := os.Stat(path)
		if err == nil || !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("waited %s (the bound is $%s; is the village DaemonSet's agent running on this node?): %w", bound, AgentWaitEnv, err)
		}
		time.Sleep(AgentPoll)
	}
}
