package kubecluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// The DualStack cluster's edit of the shipped ConfigMap still finds the
// shipped IPv4 route, and adds exactly the IPv6 one.
func TestDualStackRoutesOnShippedConfigMap(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := dualStackRoutes(shipped)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]`; strings.Count(string(got), want) != 1 || len(got) != len(shipped)+len(`, { "dst": "::/0" }`) {
		t.Errorf("dualStackRoutes: want the shipped template with %s once and nothing else changed:\n%s", want, got)
	}
	if _, err := dualStackRoutes([]byte(`"routes": []`)); err == nil {
		t.Error("dualStackRoutes of a template without the shipped route: no error")
	}
}

func TestDualStackRanges(t *testing.T) {
	if got := (Options{}).ClusterCIDRs() + " " + (Options{}).ServiceCIDRs(); got != ClusterCIDR+" "+ServiceCIDR {
		t.Errorf("single stack: %s", got)
	}
	o := Options{DualStack: true}
	if got, want := o.ClusterCIDRs()+" "+o.ServiceCIDRs(), "10.244.0.0/16,fd00:10:244::/56 10.96.0.0/16,fd00:10:96::/112"; got != want {
		t.Errorf("dual stack: %s, want %s", got, want)
	}
}
