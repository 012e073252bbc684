package deploy

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/village-cni/village/internal/testenv"
)

// regenerate is the command that brings deploy/village.yaml in line with
// deploy/kubernetes/, named in every failure below.
const regenerate = "run ./scripts/village-yaml.sh (it rewrites deploy/village.yaml from deploy/kubernetes/) and commit the result"

// TestOneFileInstall: deploy/village.yaml, the one-file install, is what
// scripts/village-yaml.sh makes of deploy/kubernetes/ today, byte for byte,
// and holds exactly the directory's objects (decoded strictly, compared as
// API objects), so `kubectl apply -f deploy/village.yaml` installs what the
// directory does.
func TestOneFileInstall(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(root, "deploy", "village.yaml"))
	if err != nil {
		t.Fatalf("deploy/village.yaml: %v; %s", err, regenerate)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "village-yaml.sh"), "-")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	generated, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/village-yaml.sh -: %v\n%s", err, stderr.Bytes())
	}
	if !bytes.Equal(committed, generated) {
		t.Errorf("deploy/village.yaml differs from what scripts/village-yaml.sh makes of deploy/kubernetes/ (first difference at line %d); %s",
			firstDiffLine(committed, generated), regenerate)
	}

	want := objectsByKey(t, load(t).all)
	got := objectsByKey(t, decodeAll(t, "deploy/village.yaml", committed))
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s of deploy/kubernetes/ is missing from deploy/village.yaml; %s", k, regenerate)
		case !equality.Semantic.DeepEqual(g, want[k]):
			t.Errorf("%s differs between deploy/kubernetes/ and deploy/village.yaml; %s", k, regenerate)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("deploy/village.yaml holds %s, which deploy/kubernetes/ does not; %s", k, regenerate)
		}
	}
}

// objectsByKey indexes objects by kind, namespace and name; a key seen
// twice is an error (kubectl apply would keep only the last).
func objectsByKey(t *testing.T, objs []runtime.Object) map[string]runtime.Object {
	t.Helper()
	m := map[string]runtime.Object{}
	for _, o := range objs {
		a, err := meta.Accessor(o)
		if err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("%s %s/%s", strings.TrimPrefix(fmt.Sprintf("%T", o), "*"), a.GetNamespace(), a.GetName())
		if _, dup := m[k]; dup {
			t.Errorf("%s appears twice", k)
		}
		m[k] = o
	}
	return m
}

func firstDiffLine(a, b []byte) int {
	al, bl := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := range min(len(al), len(bl)) {
		if !bytes.Equal(al[i], bl[i]) {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
