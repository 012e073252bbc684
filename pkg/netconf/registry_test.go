package netconf_test

import (
	"encoding/json"
	"testing"

	"github.com/village-cni/village/pkg/netconf"
)

func TestRegistryTypes(t *testing.T) {
	for _, tc := range []struct {
		raw             string
		ok              bool
		typ, kubeconfig string
	}{
		{`{"type":"etcd","endpoints":["http://127.0.0.1:2379"]}`, true, "etcd", ""},
		{`{"endpoints":["http://127.0.0.1:2379"]}`, true, "etcd", ""},
		{`{"type":"kubernetes"}`, true, "kubernetes", ""},
		{`{"type":"kubernetes","kubeconfig":"/etc/village/kubeconfig"}`, true, "kubernetes", "/etc/village/kubeconfig"},
		{`{"type":"kubernetes","endpoints":["http://127.0.0.1:2379"]}`, false, "", ""},
		{`{"type":"kubernetes","caFile":"/x"}`, false, "", ""},
		{`{"type":"etcd","endpoints":["http://127.0.0.1:2379"],"kubeconfig":"/x"}`, false, "", ""},
		{`{"type":"consul"}`, false, "", ""},
	} {
		b, err := netconf.ParseBackend(json.RawMessage(`{"type":"vxlan","registry":` + tc.raw + `}`))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.raw, err, tc.ok)
			continue
		}
		if tc.ok && (b.Registry.Type != tc.typ || b.Registry.Kubeconfig != tc.kubeconfig) {
			t.Errorf("%s: parsed %+v", tc.raw, b.Registry)
		}
	}
}
