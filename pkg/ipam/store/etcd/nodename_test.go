package etcd

import (
	"os"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/nodelocal"
)

// Without ipam.store.nodeName the store records the name the agent
// published for its network, not the host name: a node whose host name
// differs from its node name (an FQDN, capitals, --hostname-override) must
// not record its LAN allocations under a name the registry does not know.
func TestNodeNameFromAgent(t *testing.T) {
	t.Setenv(nodelocal.RunDirEnv, t.TempDir())
	t.Setenv("NODE_NAME", "")
	open := func() *Store {
		s, err := New(Options{Endpoints: []string{"http://127.0.0.1:1"}, Network: "lan"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	h, _ := os.Hostname()
	if got := open().Node(); got != strings.ToLower(h) {
		t.Errorf("nothing published: node %q, want the host name in lower case %q", got, strings.ToLower(h))
	}
	if err := nodelocal.PublishNodeName("", "lan", "agent-node-7"); err != nil {
		t.Fatal(err)
	}
	if got := open().Node(); got != "agent-node-7" {
		t.Errorf("published agent-node-7: node %q", got)
	}
}
