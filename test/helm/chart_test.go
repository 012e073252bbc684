package helm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// repoRoot is Village's checkout: this module lives in test/helm.
const repoRoot = "../.."

var chartDir = filepath.Join(repoRoot, "deploy", "helm", "village")

// render renders the chart as `helm install village deploy/helm/village -n
// kube-system [-f file]... [--set k=v]...` would, and returns every
// non-empty document it yields.
func render(t *testing.T, valuesFiles []string, set map[string]any) []map[string]any {
	t.Helper()
	out, err := renderErr(valuesFiles, set)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func renderErr(valuesFiles []string, set map[string]any) ([]map[string]any, error) {
	var files []string
	for _, f := range valuesFiles {
		files = append(files, filepath.Join(chartDir, f))
	}
	b, err := Render(chartDir, files, set)
	if err != nil {
		return nil, err
	}
	return decodeDocs("the rendered chart", b)
}

// decodeDocs parses a YAML stream into generic objects, skipping documents
// with nothing but comments.
func decodeDocs(name string, b []byte) ([]map[string]any, error) {
	var out []map[string]any
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s document %d: %w", name, i, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("%s document %d: %w\n%s", name, i, err, doc)
		}
		if len(m) != 0 {
			out = append(out, m)
		}
	}
}

// key names an object as kubectl does: kind, namespace, name.
func key(o map[string]any) string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%v %v/%v", o["kind"], md["namespace"], md["name"])
}

// normalize makes a ConfigMap's JSON values (the conflist template)
// comparable as JSON, not as text: layout and key order are no difference.
func normalize(o map[string]any) {
	if o["kind"] != "ConfigMap" {
		return
	}
	data, _ := o["data"].(map[string]any)
	for k, v := range data {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var j any
		if json.Unmarshal([]byte(s), &j) == nil {
			data[k] = j
		}
	}
}

// TestChartDefaultsAreTheOneFileInstall: the chart with its default values
// renders exactly the objects of deploy/village.yaml, compared as parsed
// objects (the ConfigMap's conflist as JSON).
func TestChartDefaultsAreTheOneFileInstall(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "village.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fileDocs, err := decodeDocs("deploy/village.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	want, got := map[string]map[string]any{}, map[string]map[string]any{}
	for _, d := range fileDocs {
		normalize(d)
		want[key(d)] = d
	}
	for _, d := range render(t, nil, nil) {
		normalize(d)
		if _, dup := got[key(d)]; dup {
			t.Errorf("the chart renders %s twice", key(d))
		}
		got[key(d)] = d
	}
	const fix = "deploy/helm/village/templates must render what deploy/kubernetes/ holds " +
		"(after editing deploy/kubernetes/, run ./scripts/village-yaml.sh and make the same change in the chart's templates)"
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart does not render %s of deploy/village.yaml; %s", k, fix)
			continue
		}
		if !reflect.DeepEqual(g, want[k]) {
			gj, _ := yaml.Marshal(g)
			wj, _ := yaml.Marshal(want[k])
			t.Errorf("%s: the chart renders\n%s\ndeploy/village.yaml has\n%s\n%s", k, gj, wj, fix)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("the chart renders %s, which deploy/village.yaml lacks; %s", k, fix)
		}
	}
}

// daemonSet returns the rendered DaemonSet, decoded strictly into the
// typed API object.
func daemonSet(t *testing.T, docs []map[string]any) *appsv1.DaemonSet {
	t.Helper()
	for _, d := range docs {
		if d["kind"] != "DaemonSet" {
			continue
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		ds := &appsv1.DaemonSet{}
		if err := yaml.UnmarshalStrict(b, ds); err != nil {
			t.Fatalf("the rendered DaemonSet does not decode: %v", err)
		}
		return ds
	}
	t.Fatal("the chart renders no DaemonSet")
	return nil
}

// conflistTemplate returns the rendered ConfigMap's conflist template.
func conflistTemplate(t *testing.T, docs []map[string]any) string {
	t.Helper()
	for _, d := range docs {
		if d["kind"] == "ConfigMap" {
			data, _ := d["data"].(map[string]any)
			if s, ok := data["10-village.conflist.tmpl"].(string); ok {
				return s
			}
		}
	}
	t.Fatal("the chart renders no ConfigMap with 10-village.conflist.tmpl")
	return ""
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// hostPathAt returns the host path of the volume c mounts at mountPath,
// and whether the mount is writable.
func hostPathAt(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, mountPath string) (string, bool) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != mountPath {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				return filepath.Join(v.HostPath.Path, m.SubPath), !m.ReadOnly
			}
		}
		t.Fatalf("%s: %s is not mounted from a hostPath volume", c.Name, mountPath)
	}
	t.Fatalf("%s: nothing mounted at %s", c.Name, mountPath)
	return "", false
}

func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}
