// Command village-chart renders Village's Helm chart to stdout with Helm's
// Go library, as `helm template` would, for tests that install Village
// through the chart without a helm binary (internal/kubecluster,
// Options.Chart):
//
//	cd test/helm && go run ./cmd/village-chart [-f values.yaml]... [-set key=value]... CHART_DIR
//
// -set takes dotted keys with string values (backend=vxlan,
// cni.binDir=/opt/cni/bin); "true" and "false" are booleans.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/village-cni/village/test/helm"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var files, sets list
	flag.Var(&files, "f", "a values file (repeatable)")
	flag.Var(&sets, "set", "key=value, dotted keys (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: village-chart [-f values.yaml]... [-set key=value]... CHART_DIR")
		os.Exit(2)
	}
	set := map[string]any{}
	for _, s := range sets {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "village-chart: -set %q: want key=value\n", s)
			os.Exit(2)
		}
		var val any = v
		switch v {
		case "true":
			val = true
		case "false":
			val = false
		}
		m := set
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = val
	}
	out, err := helm.Render(flag.Arg(0), files, set)
	if err != nil {
		fmt.Fprintf(os.Stderr, "village-chart: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
