package agent

import (
	"context"
	"strings"
	"testing"
)

// TestLANAllWarning: a LAN section that gives every pod the LAN interface
// ("pods" "all", or the key left out) is warned about on a Kubernetes node
// (kubernetes registry, or an agent in a pod), in the log line and as
// `villaged status`'s first LAN line; "annotated", and "all" off
// Kubernetes, are not.
func TestLANAllWarning(t *testing.T) {
	const lan = `"macvlan":{"master":"eth0"%s,"ipam":{"type":"village-ipam","ranges":[[{"subnet":"192.168.50.0/24","rangeStart":"192.168.50.200","rangeEnd":"192.168.50.250"}]]}}`
	for _, tc := range []struct {
		name, pods, registry string
		inPod, warn          bool
	}{
		{"kubernetes registry, pods left out", "", `{"type":"kubernetes"}`, false, true},
		{"kubernetes registry, pods all", `,"pods":"all"`, `{"type":"kubernetes"}`, false, true},
		{"kubernetes registry, pods annotated", `,"pods":"annotated"`, `{"type":"kubernetes"}`, false, false},
		{"etcd registry, in a pod, pods left out", "", `{"endpoints":["http://192.0.2.1:2379"]}`, true, true},
		{"etcd registry, in a pod, annotated", `,"pods":"annotated"`, `{"endpoints":["http://192.0.2.1:2379"]}`, true, false},
		{"etcd registry off Kubernetes, pods left out", "", `{"endpoints":["http://192.0.2.1:2379"]}`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := ""
			if tc.inPod {
				host = "10.96.0.1"
			}
			t.Setenv("KUBERNETES_SERVICE_HOST", host)
			conf := `{"cniVersion":"1.1.0","name":"lan","plugins":[{"type":"village","clusterCIDR":"10.70.0.0/16","ipam":{"type":"village-ipam"},` +
				`"backend":{"type":"vxlan","registry":` + tc.registry + `},` + strings.Replace(lan, "%s", tc.pods, 1) + `}]}`
			c, err := Load(Options{ConfFile: write(t, "10-lan.conflist", conf), NodeName: "n1", RunDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			w := lanAllWarning(c)
			if (w != "") != tc.warn || (tc.warn && !strings.Contains(w, `"annotated"`)) {
				t.Fatalf("warning %q, want one: %v", w, tc.warn)
			}
			// No agent answers on the run dir's socket: the status says so,
			// and still carries the warning first.
			lines := lanStatus(context.Background(), c, t.TempDir())
			if len(lines) == 0 || strings.HasPrefix(lines[0], "LAN pods: WARNING") != tc.warn {
				t.Fatalf("status lines %q, want the warning first: %v", lines, tc.warn)
			}
		})
	}
}
