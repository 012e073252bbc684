// Package helm renders Village's Helm chart (deploy/helm/village) with
// Helm's own Go library, and tests it: its defaults are deploy/village.yaml,
// and the k3s and kubeadm values put the CNI files where those
// distributions' runtimes look, proven by running the rendered `villaged
// install`. Render (and cmd/village-chart) serve tests that install Village
// through the chart. It is its own module (helm.sh/helm/v4 pulls in much that
// Village's binaries and main module must not carry); scripts/test.sh vets
// and tests it separately.
package helm

import (
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
)

// Render renders the chart in chartDir as `helm install village <chartDir>
// -n kube-system -f <valuesFiles>... --set <set>` would, with Helm's own
// library, and returns the manifests as one YAML stream (the templates in
// name order, each after a "---").
func Render(chartDir string, valuesFiles []string, set map[string]any) ([]byte, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	vals := map[string]any{}
	for _, f := range valuesFiles {
		v, err := common.ReadValuesFile(f)
		if err != nil {
			return nil, fmt.Errorf("values %s: %w", f, err)
		}
		vals = util.MergeTables(v, vals)
	}
	vals = util.MergeTables(set, vals)
	rv, err := util.ToRenderValuesWithSchemaValidation(ch, vals,
		common.ReleaseOptions{Name: "village", Namespace: "kube-system", IsInstall: true}, common.DefaultCapabilities, false)
	if err != nil {
		return nil, fmt.Errorf("chart %s values: %w", chartDir, err)
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", chartDir, err)
	}
	var out bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if filepath.Ext(name) != ".yaml" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, files[name])
	}
	return out.Bytes(), nil
}
