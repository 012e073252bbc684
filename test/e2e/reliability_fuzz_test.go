package e2e

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/testenv"
)

// fuzzTargets are the fuzz targets of every parser of outside input, by
// package. TestFuzzTargets fails when the module has one that is not here.
var fuzzTargets = map[string][]string{
	"./pkg/netconf":         {"FuzzParse", "FuzzParseBackend", "FuzzCNIArgs", "FuzzParseLAN", "FuzzParseLANAddrs", "FuzzFromList"},
	"./pkg/owner":           {"FuzzTableNames"},
	"./pkg/lansvc/elect":    {"FuzzOwnerIsEligibleAndLive"},
	"./pkg/lansvc/plan":     {"FuzzPlan"},
	"./pkg/lansvc/announce": {"FuzzParseNDP"},
	"./pkg/lansvc/members":  {"FuzzParseKey"},
	"./pkg/agentsock":       {"FuzzHandle", "FuzzDecode"},
	"./pkg/ipam/config":     {"FuzzParse", "FuzzParseConfig", "FuzzParseCNIArgs"},
	"./pkg/subnetfile":      {"FuzzRead"},
	"./pkg/netpol":          {"FuzzCompile", "FuzzExplain"},
	"./pkg/netpol/drops":    {"FuzzParse"},
	"./cmd/villaged":        {"FuzzParsePortProto"},
	"./pkg/ipam/store/disk": {"FuzzParseRecord", "FuzzDecodeIndex", "FuzzStoreOverDamagedFiles"},
	"./pkg/ipam/plugin":     {"FuzzParseResolvConf"},
	"./pkg/landhcp":         {"FuzzReadRequest"},
	"./internal/mdnsdemo":   {"FuzzAnswer"},
	"./pkg/wireguard":       {"FuzzChoosePaths"},
	"./pkg/validate": {"FuzzLinkName", "FuzzMAC", "FuzzMTU", "FuzzNodeName", "FuzzNamespaceName",
		"FuzzNetworkName", "FuzzContainerID", "FuzzLogLevel"},
}

var fuzzFunc = regexp.MustCompile(`^func (Fuzz\w+)\(f \*testing\.F\)`)

// TestFuzzTargets checks the list above against the module's sources and,
// with VILLAGE_FUZZTIME set (a Go duration, e.g. 30s), runs every target
// for that long, one at a time with one worker (the box is shared). Without
// it, `go test` has already replayed each target's seeds and testdata/fuzz
// corpus as ordinary tests.
func TestFuzzTargets(t *testing.T) {
	root, err := testenv.ModuleRoot()
	must(t, err, "module root")
	found := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if m := fuzzFunc.FindStringSubmatch(sc.Text()); m != nil {
				rel, _ := filepath.Rel(root, filepath.Dir(path))
				found["./"+rel] = append(found["./"+rel], m[1])
			}
		}
		return sc.Err()
	})
	must(t, err, "walking the module")
	for pkg, names := range found {
		for _, name := range names {
			if !slices.Contains(fuzzTargets[pkg], name) {
				t.Errorf("fuzz target %s.%s is not in fuzzTargets: add it", pkg, name)
			}
		}
	}
	for pkg, names := range fuzzTargets {
		for _, name := range names {
			if !slices.Contains(found[pkg], name) {
				t.Errorf("fuzzTargets lists %s.%s, which does not exist", pkg, name)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	s := os.Getenv("VILLAGE_FUZZTIME")
	if s == "" {
		t.Logf("%d fuzz targets listed; VILLAGE_FUZZTIME=30s runs each for 30s", len(slices.Concat(slices.Collect(maps.Values(fuzzTargets))...)))
		return
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("VILLAGE_FUZZTIME=%q: want a Go duration such as 30s", s)
	}
	for pkg, names := range fuzzTargets {
		for _, name := range names {
			// A short minimisation budget: the default (60 s per new input)
			// stalls targets that do file I/O, whose coverage is noisy.
			cmd := exec.Command("go", "test", "-run", "^$", "-fuzz", "^"+name+"$", "-fuzztime", d.String(),
				"-fuzzminimizetime", "2s", "-parallel", "1", pkg)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			last := ""
			for _, l := range lines {
				if strings.HasPrefix(l, "fuzz: elapsed") {
					last = l
				}
			}
			if err != nil {
				t.Errorf("%s %s: %v\n%s", pkg, name, err, out)
				continue
			}
			t.Logf("%s %s: %s", pkg, name, last)
		}
	}
}
