package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// BenchmarkNetpolAdd: a pod's ADD through the built plugins (libcni) with
// "networkPolicy" off (ADD reads nothing more), on before the node's first
// compile (no controller holds the ready file: ADD marks every pod, making
// the pending table when missing), on with the pod's namespace free of
// policies (ADD reads the file), and on with a policy in the pod's
// namespace (ADD also marks the pod's address pending in nftables). The
// controller's side is what it leaves on the node: its pending table,
// namespaces file and held ready file, made here with pkg/netpol/table as
// the agent does. DEL, and the agent's unmarking of the address, are
// outside the timer.
func BenchmarkNetpolAdd(b *testing.B) {
	for _, mode := range []string{"off", "on-no-compile-yet", "on-other-namespace", "on-policy-namespace"} {
		b.Run(mode, func(b *testing.B) {
			n := NewNode(b)
			name := fmt.Sprintf("npadd%d", os.Getpid())
			list := ConfList(b, fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"village","bridge":"vlg-npadd","isDefaultGateway":true,"ipMasq":true,
				"networkPolicy":%v,"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.54.2.0/24"}]]}}]}`, name, mode != "off", filepath.Join(n.Dir, "pods")))
			b.Cleanup(func() { _ = os.RemoveAll(filepath.Join(nodelocal.RunDir(), name)) })
			empty := &table.Ruleset{Network: name}
			if mode == "on-other-namespace" || mode == "on-policy-namespace" {
				ready, err := table.HoldReady(table.ReadyPath("", name))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { ready.Close() })
				listed := "elsewhere"
				if mode == "on-policy-namespace" {
					listed = "np"
				}
				if err := table.WriteNamespaces(table.NamespacesPath("", name), []string{listed}); err != nil {
					b.Fatal(err)
				}
				if err := testenv.InNS(n.NS, func() error { return table.Apply(empty) }); err != nil {
					b.Fatal(err)
				}
			}
			pod := n.NewPod()
			args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "np"}, {"K8S_POD_NAME", "p"}}
			marked := 0
			b.ResetTimer()
			for range b.N {
				res, err := addArgs(n, list, pod, args...)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				var left []netip.Addr
				if err := testenv.InNS(n.NS, func() (err error) {
					if left, err = table.Pending(name); err != nil || len(left) == 0 {
						return err
					}
					marked++
					done := *empty
					done.Compiled = left
					return table.Apply(&done)
				}); err != nil {
					b.Fatal(err)
				}
				if (mode == "on-policy-namespace" || mode == "on-no-compile-yet") && len(left) != len(res.IPs) {
					b.Fatalf("ADD marked %v pending, want the pod's %d addresses", left, len(res.IPs))
				}
				if err := n.Del(list, pod); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(marked)/float64(b.N), "marked/op")
		})
	}
}
