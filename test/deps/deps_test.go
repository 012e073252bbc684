// Package deps checks what the CNI plugin binaries link: the runtime execs
// village, village-ipam and loopback for every pod, so they stay lean and do
// not carry the Kubernetes client (or the etcd client), which only villaged
// and the separately exec'd store helpers need. It also keeps the package
// map of docs/architecture.md true (arch_test.go), and the links of the
// README and docs/ pointing at files and headings that exist
// (links_test.go).
package deps

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

func TestPluginsDoNotLinkClients(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"k8s.io/client-go", "k8s.io/api/", "k8s.io/apimachinery", "go.etcd.io/etcd", "google.golang.org/grpc"}
	for _, pkg := range []string{"./plugins/main/village", "./plugins/ipam/village-ipam", "./plugins/main/loopback"} {
		t.Run(pkg, func(t *testing.T) {
			cmd := exec.Command("go", "list", "-deps", pkg)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
			}
			deps := strings.Fields(string(out))
			if len(deps) < 10 {
				t.Fatalf("go list -deps %s listed only %v", pkg, deps)
			}
			for _, d := range deps {
				for _, f := range forbidden {
					if strings.HasPrefix(d, f) {
						t.Errorf("%s links %s", pkg, d)
					}
				}
			}
		})
	}
}
