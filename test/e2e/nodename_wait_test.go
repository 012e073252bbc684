package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/nodelocal"
)

// TestKubernetesADDWaitsForAgentNodeName: the LAN pool in etcd without
// ipam.store.nodeName, a node whose agent has not published its name yet
// (a node booting: its run directory empty). A Kubernetes pod's ADD
// through the real village-ipam must not record the host name (the
// reclaim hazard of issue 37): it waits for the agent's name and records
// that, or fails with code 11 naming the file at the bound, leaving
// nothing in etcd. An ADD without a Kubernetes pod (standalone) keeps the
// documented host-name default.
func TestKubernetesADDWaitsForAgentNodeName(t *testing.T) {
	n := NewNode(t)
	etcd := etcdtest.StartIn(t, n.NS, "127.0.0.1")
	run := t.TempDir()
	const network = "nnw"
	stdin := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"ipam":{"type":"village-ipam","store":{"type":"etcd","endpoints":[%q]},
		"ranges":[[{"subnet":"192.168.81.0/24","rangeStart":"192.168.81.10","rangeEnd":"192.168.81.20"}]]}}`, network, etcd.Endpoints[0]))
	k8s := func(pod string) string {
		return "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=" + pod + ";K8S_POD_INFRA_CONTAINER_ID=" + pod
	}
	add := func(id, args, wait string) testenv.Output {
		return n.Exec(testenv.Call{Bin: "village-ipam", Command: "ADD", ContainerID: id, IfName: "net1", Netns: "/x", Args: args, Stdin: stdin,
			Env: []string{nodelocal.RunDirEnv + "=" + run, nodelocal.AgentWaitEnv + "=" + wait}})
	}
	cli := etcd.ClientIn(t, n.NS)
	holders := func() map[string]string { // container ID -> node of each allocation
		resp, err := cli.Get(context.Background(), "/village/ipam/"+network+"/ips/", clientv3.WithPrefix())
		must(t, err, "reading the allocations")
		out := map[string]string{}
		for _, kv := range resp.Kvs {
			var r struct{ ContainerID, Node string }
			must(t, json.Unmarshal(kv.Value, &r), "allocation %s", kv.Key)
			out[r.ContainerID] = r.Node
		}
		return out
	}

	// Nothing published within the bound: code 11, naming the file.
	out := add("early", k8s("early"), "1s")
	e := CNIError(t, out)
	if e.Code != 11 || !strings.Contains(e.Msg, nodelocal.NodeNameFile(run, network)) {
		t.Fatalf("Kubernetes ADD with no published node name: code %d %q (stderr %s), want 11 naming %s", e.Code, e.Msg, out.Stderr, nodelocal.NodeNameFile(run, network))
	}
	if h := holders(); len(h) != 0 {
		t.Fatalf("the failed ADD left allocations: %v", h)
	}

	// The agent publishes while the ADD waits: its name is recorded.
	done := make(chan testenv.Output, 1)
	go func() { done <- add("waits", k8s("waits"), "2m") }()
	must(t, nodelocal.PublishNodeName(run, network, "agent-node"), "publishing the node name")
	if out := <-done; out.ExitCode != 0 {
		t.Fatalf("Kubernetes ADD with the name published during its wait: %s %s", out.Stdout, out.Stderr)
	}
	if h := holders(); h["waits"] != "agent-node" {
		t.Fatalf("allocations %v, want waits held by agent-node", h)
	}

	// Standalone, no agent: the host name, as documented.
	must(t, os.RemoveAll(nodelocal.NetworkDir(run, network)), "unpublishing")
	if out := add("standalone", "", "1s"); out.ExitCode != 0 {
		t.Fatalf("standalone ADD: %s %s", out.Stdout, out.Stderr)
	}
	host, err := nodelocal.HostNodeName()
	must(t, err, "host name")
	if h := holders(); h["standalone"] != host {
		t.Fatalf("allocations %v, want standalone held by the host name %s", h, host)
	}
}
