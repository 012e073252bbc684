package kubecluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VillageNamespace and VillageDaemonSet name the shipped DaemonSet.
const (
	VillageNamespace = "kube-system"
	VillageDaemonSet = "village"
	VillageSelector  = "app.kubernetes.io/name=village"
)

// installVillage applies deploy/kubernetes with kubectl (the release's,
// with Options.Release). The differences from the shipped files: when
// Options.Backend is set or Options.DualStack, the DaemonSet's init
// container "install" gets BACKEND=<backend> (when set) and
// CLUSTER_CIDR=Options.ClusterCIDRs() (`kubectl set env --local` over the
// shipped daemonset.yaml, which changes those env values and nothing
// else). Every other file is applied as it is in the tree: the shipped
// ConfigMap's isDefaultGateway routes every family a pod has, so a
// dual-stack cluster needs nothing else.
func (c *Cluster) installVillage(t testing.TB) {
	t.Helper()
	src := filepath.Join(c.root, "deploy", "kubernetes")
	if c.opts.Release != nil {
		// The release's own manifests, as its users applied them.
		src = filepath.Join(c.opts.Release.Dir, "deploy", "kubernetes")
	}
	dst := filepath.Join(c.dir, "manifests")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	if c.opts.Chart {
		if c.opts.Release != nil {
			t.Fatalf("kubecluster: Options.Chart and Options.Release together: release %s is installed from its deploy/kubernetes", c.opts.Release.Tag)
		}
		if c.opts.DualStack {
			t.Fatal("kubecluster: Options.Chart and Options.DualStack together: the harness gives the chart's podCIDR one range")
		}
		c.installVillageChart(t, dst)
		return
	}
	if c.opts.DualStack && c.opts.Release != nil {
		t.Fatalf("kubecluster: Options.DualStack and Options.Release together: release %s's manifests are applied as they are", c.opts.Release.Tag)
	}
	files, err := filepath.Glob(filepath.Join(src, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("kubecluster: no manifests in %s (%v)", src, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
		if (c.opts.Backend != "" || c.opts.DualStack) && filepath.Base(f) == "daemonset.yaml" {
			env := []string{"CLUSTER_CIDR=" + c.opts.ClusterCIDRs()}
			if c.opts.Backend != "" {
				env = append(env, "BACKEND="+c.opts.Backend)
			}
			set, err := c.Kubectl(append([]string{"set", "env", "--local", "-f", f, "-c", "install", "-o", "yaml"}, env...)...)
			if err != nil {
				t.Fatalf("kubecluster: %v", err)
			}
			// Nothing printed: the shipped values are these already.
			if len(set) > 0 {
				b = set
			}
			for _, e := range env {
				if _, v, _ := strings.Cut(e, "="); !strings.Contains(string(b), "value: "+v) {
					t.Fatalf("kubecluster: kubectl set env did not set %s in the DaemonSet:\n%s", e, b)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
	}
	if out, err := c.Kubectl("apply", "-f", dst); err != nil {
		t.Fatalf("kubecluster: applying deploy/kubernetes: %v\n%s", err, out)
	}
}

// installVillageChart renders deploy/helm/village as `helm install village
// deploy/helm/village -n kube-system --set podCIDR=ClusterCIDR [--set
// backend=Backend]` would (test/helm's village-chart, Helm's own library:
// test/helm is its own module, so Helm stays out of this one) and applies
// what it renders.
func (c *Cluster) installVillageChart(t testing.TB, dst string) {
	t.Helper()
	args := []string{"run", "./cmd/village-chart", "-set", "podCIDR=" + ClusterCIDR}
	if c.opts.Backend != "" {
		args = append(args, "-set", "backend="+c.opts.Backend)
	}
	args = append(args, filepath.Join(c.root, "deploy", "helm", "village"))
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(c.root, "test", "helm")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubecluster: rendering the chart (go %s in test/helm): %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	if c.opts.Backend != "" && !strings.Contains(string(out), "value: "+strconv.Quote(c.opts.Backend)) {
		t.Fatalf("kubecluster: the rendered chart does not set BACKEND=%s:\n%s", c.opts.Backend, out)
	}
	f := filepath.Join(dst, "village-chart.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	if out, err := c.Kubectl("apply", "-f", f); err != nil {
		t.Fatalf("kubecluster: applying the rendered chart: %v\n%s", err, out)
	}
}

// WaitVillageReady waits until every node is Ready and the DaemonSet has
// rolled out: one up-to-date, ready pod on every node.
func (c *Cluster) WaitVillageReady(timeout time.Duration) error {
	nodes := c.Nodes()
	for _, n := range nodes {
		if err := c.WaitNodeReady(n.Name, timeout); err != nil {
			return err
		}
	}
	return poll(timeout, func() error {
		ds, err := c.Client().AppsV1().DaemonSets(VillageNamespace).Get(context.Background(), VillageDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || int(st.DesiredNumberScheduled) != len(nodes) ||
			st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled ||
			st.NumberAvailable != st.DesiredNumberScheduled {
			return fmt.Errorf("DaemonSet %s/%s: %d nodes, desired %d, updated %d, ready %d, available %d (generation %d, observed %d)",
				VillageNamespace, VillageDaemonSet, len(nodes), st.DesiredNumberScheduled, st.UpdatedNumberScheduled,
				st.NumberReady, st.NumberAvailable, ds.Generation, st.ObservedGeneration)
		}
		return nil
	})
}
