package kube_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestConformanceReportExpect: a Ginkgo JUnit report of the granular set is
// judged by its content, not by e2e.test's exit code alone: a clean run
// passes; a Netpol test that skipped itself, a suite that ran too few tests,
// or a subset test missing from the report each fail it. Skips of
// conformanceSkips and specs outside the focus are fine.
func TestConformanceReportExpect(t *testing.T) {
	type spec struct{ name, state string } // state: passed, skipped, failed
	granular := func() []spec {
		var s []spec
		for i := range 16 {
			s = append(s, spec{fmt.Sprintf("[sig-network] Networking Granular Checks: Pods should function for check %d [NodeConformance]", i), "passed"})
		}
		for i := range 5 {
			s = append(s, spec{fmt.Sprintf("[sig-network] Networking Granular Checks: Services should function for sctp check %d [Feature:SCTPConnectivity]", i), "skipped"})
		}
		for _, n := range netpolSubsetTests {
			s = append(s, spec{netpolPrefix + n + " [Feature:NetworkPolicy]", "passed"})
		}
		// Outside the focus: listed as skipped by Ginkgo, not counted.
		s = append(s, spec{netpolPrefix + "deny egress from all pods in a namespace [Feature:NetworkPolicy]", "skipped"},
			spec{"[sig-storage] a volume test", "skipped"})
		return s
	}
	with := func(name, state string) []spec {
		s := granular()
		for i := range s {
			if strings.Contains(s[i].name, name) {
				s[i].state = state
			}
		}
		return s
	}
	without := func(name string) []spec {
		var s []spec
		for _, x := range granular() {
			if !strings.Contains(x.name, name) {
				s = append(s, x)
			}
		}
		return s
	}
	for _, tc := range []struct {
		name     string
		specs    []spec
		setFocus bool
		want     []string // substrings of the errors, in order; none: a pass
	}{
		{"clean run", granular(), true, nil},
		{"a subset test skipped itself", with("named port", "skipped"), true,
			[]string{"named port [Feature:NetworkPolicy]: skipped by the test itself", "20 tests passed, want at least 21", `Netpol test "allow ingress access on one named port" did not pass`}},
		{"a subset test failed", with("CIDR block", "failed"), true,
			[]string{"20 tests passed", `"enforce except clause while egress access to server in CIDR block" did not pass`}},
		{"a subset test missing from the report", without("deleted"), true,
			[]string{"20 tests passed", `"stop enforcing policies after they are deleted" did not pass`}},
		{"the whole suite skipped itself", with("[sig-network]", "skipped"), true,
			[]string{"skipped by the test itself"}},
		{"own focus: no floor, but still no self-skip", with("Pods should function for check 3 ", "skipped"), false,
			[]string{"check 3 [NodeConformance]: skipped by the test itself"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var b strings.Builder
			fmt.Fprintf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"%d\">\n <testsuite name=\"Kubernetes e2e suite\">\n", len(tc.specs))
			for _, s := range tc.specs {
				fmt.Fprintf(&b, "  <testcase name=%q classname=\"Kubernetes e2e suite\" status=%q time=\"1\">", "[It] "+s.name, s.state)
				switch s.state {
				case "skipped":
					b.WriteString(`<skipped message="skipped"></skipped>`)
				case "failed":
					b.WriteString(`<failure message="timed out" type="failed">[FAILED] timed out</failure>`)
				}
				b.WriteString("</testcase>\n")
			}
			b.WriteString(" </testsuite>\n</testsuites>\n")
			if err := os.WriteFile(filepath.Join(dir, "junit_01.xml"), []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := parseJUnit(dir, conformanceFocus["granular"])
			if err != nil {
				t.Fatal(err)
			}
			errs := r.expect("granular", tc.setFocus)
			if tc.want == nil {
				// Only the specs of the focus were counted.
				if len(errs) != 0 || len(r.passed) != 21 || len(r.skipped) != 5 {
					t.Fatalf("passed %d, skipped %d (want 21, 5): %v", len(r.passed), len(r.skipped), errs)
				}
				return
			}
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			all := strings.Join(got, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("errors lack %q:\n%s", w, all)
				}
			}
		})
	}
}

// The dualstack set's focus takes the upstream dual-stack tests and no
// other sig-network test; its SCTP test is skipped for the SCTP reason; and
// every set of conformanceFocus has a floor and is one scripts/conformance.sh
// accepts.
func TestConformanceSets(t *testing.T) {
	re := regexp.MustCompile(conformanceFocus["dualstack"])
	for name, want := range map[string]bool{
		"[sig-network] [Feature:IPv6DualStack] should have at least one dual-stack node":                                                       true,
		"[sig-network] [Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for pod-Service: udp": true,
		"[sig-network] Networking Granular Checks: Services should function for pod-Service: udp":                                              false,
		"[sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]":  false,
	} {
		if re.MatchString(name) != want {
			t.Errorf("dualstack focus matches %q: %v, want %v", name, !want, want)
		}
	}
	if r := skipReason("[sig-network] [Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for pod-Service: sctp [Feature:SCTPConnectivity]"); !strings.Contains(r, "SCTP") {
		t.Errorf("the dual-stack SCTP test's skip reason: %s", r)
	}
	script, err := os.ReadFile(filepath.Join("..", "..", "scripts", "conformance.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for set := range conformanceFocus {
		if conformanceFloor[set] == 0 {
			t.Errorf("set %s has no floor in conformanceFloor", set)
		}
		if !regexp.MustCompile(`case "\$set_" in [a-z|]*\b` + set + `\b`).Match(script) {
			t.Errorf("scripts/conformance.sh does not accept the set %s", set)
		}
	}
}
