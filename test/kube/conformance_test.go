package kube_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/village-cni/village/internal/kubecluster"
	"github.com/village-cni/village/internal/testenv"
)

// The upstream sig-network conformance suite (e2e.test of the same
// k8s.io/kubernetes release scripts/kube.sh builds) against a cluster of
// internal/kubecluster, once per kube-proxy mode. VILLAGE_CONFORMANCE picks
// the set: "granular" (default) runs the Networking Granular Checks (pods
// and Services) and a subset of the Netpol suite (netpolSubset); "full"
// adds every [sig-network] [Conformance] test and the whole Netpol suite;
// "netpol" is the Netpol suite alone; "dualstack" runs the
// [Feature:IPv6DualStack] tests on a dual-stack cluster
// (kubecluster.Options.DualStack), a set of its own because only that
// cluster can run them.
// VILLAGE_CONFORMANCE_PROCS is the number of Ginkgo processes (default 3);
// VILLAGE_CONFORMANCE_FOCUS, a regular expression, replaces the set's focus.

// conformanceNodes is the cluster's worker count, told to e2e.test with
// --num-nodes: without it the skeleton provider skips the Granular Checks
// that need a node count.
const conformanceNodes = 2

// clusterDNS is the kube-dns Service's ClusterIP in testdata/coredns.yaml
// and the kubelets' clusterDNS.
const clusterDNS = "10.96.0.10"

const granularFocus = `\[sig-network\] Networking Granular Checks`

// netpolSubsetTests are the upstream Netpol tests the default set runs:
// default deny, selectors of both kinds together, a named port, ipBlock
// with except (egress), a deleted policy. Each must pass in that set. The
// whole suite is in "full".
var netpolSubsetTests = []string{
	"support a 'default-deny-ingress' policy",
	"enforce policy based on PodSelector and NamespaceSelector",
	"allow ingress access on one named port",
	"enforce except clause while egress access to server in CIDR block",
	"stop enforcing policies after they are deleted",
}

const netpolPrefix = "[sig-network] Netpol NetworkPolicy between server and client should "

// netpolSubset is the focus that runs netpolSubsetTests.
var netpolSubset = func() string {
	q := make([]string, len(netpolSubsetTests))
	for i, n := range netpolSubsetTests {
		q[i] = regexp.QuoteMeta(n)
	}
	return regexp.QuoteMeta(netpolPrefix) + "(" + strings.Join(q, "|") + ") "
}()

// conformanceFloor is the fewest tests each set must pass, so that a suite
// that skips itself (a missing image, a provider it does not know, a focus
// that matches nothing any more) fails the test rather than passing with
// nothing run. Each is its count in the README's runs (full: 2026-12-04,
// 104 in both kube-proxy modes; dualstack: 2026-12-04, 22 in both, the
// suite's 23 less its SCTP test).
var conformanceFloor = map[string]int{"granular": 21, "full": 104, "netpol": 48, "dualstack": 22}

// conformanceFocus is what each set runs.
var conformanceFocus = map[string]string{
	"granular":  granularFocus + "|" + netpolSubset,
	"full":      granularFocus + `|\[sig-network\].*\[Conformance\]|\[sig-network\] Netpol`,
	"netpol":    `\[sig-network\] Netpol`,
	"dualstack": dualStackFocus,
}

// dualStackFocus is the upstream dual-stack suite
// (test/e2e/network/dual_stack.go): pods and Nodes with an address per
// family, Services of either family and both, and the Granular Checks of
// Services over the secondary family (IPv6).
const dualStackFocus = `\[sig-network\] \[Feature:IPv6DualStack\]`

// dualStackSet reports whether set runs on a dual-stack cluster.
func dualStackSet(set string) bool { return set == "dualstack" }

// conformanceSkips are the tests of the focus that do not run, each with
// its reason.
var conformanceSkips = []struct{ pattern, reason string }{
	{`\[Feature:SCTPConnectivity\]`, "SCTP: not loaded in this kernel (no /proc/net/sctp), and Village's own tests cover TCP and UDP only"},
	{`\[sig-network\] DNS `, "the DNS tests' probe pods run dig (bind-tools in the upstream agnhost) and the glibc-dns-testing image, neither of which is built locally; Service-name lookups of the other tests go through the cluster DNS (testdata/coredns.yaml)"},
}

func TestConformance(t *testing.T) {
	set := os.Getenv("VILLAGE_CONFORMANCE")
	if set == "" {
		set = "granular"
	}
	focus, ok := conformanceFocus[set]
	if !ok {
		t.Fatalf("VILLAGE_CONFORMANCE=%q: want granular, full, netpol or dualstack", set)
	}
	// VILLAGE_CONFORMANCE_FOCUS replaces the set's focus (re-running one
	// failed test, for example); the skip list still applies.
	if f := os.Getenv("VILLAGE_CONFORMANCE_FOCUS"); f != "" {
		if _, err := regexp.Compile(f); err != nil {
			t.Fatalf("VILLAGE_CONFORMANCE_FOCUS=%q: %v", f, err)
		}
		focus = f
	}
	procs := 3
	if p := os.Getenv("VILLAGE_CONFORMANCE_PROCS"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			t.Fatalf("VILLAGE_CONFORMANCE_PROCS=%q: want a positive number", p)
		}
		procs = n
	}
	testenv.RequireRoot(t)
	kubeDir := kubecluster.KubeDir()
	for _, b := range []string{"e2e.test", "ginkgo", "agnhost", "coredns", "kubectl"} {
		if _, err := os.Stat(filepath.Join(kubeDir, b)); err != nil {
			t.Fatalf("%s not found in %s (%v): run scripts/kube.sh", b, kubeDir, err)
		}
	}
	images := buildConformanceImages(t, t.TempDir())
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			c := kubecluster.Start(t, kubecluster.Options{Nodes: conformanceNodes, ProxyMode: mode, ClusterDNS: clusterDNS, DualStack: dualStackSet(set)})
			for _, a := range images.archives {
				if err := c.ImportImage(a); err != nil {
					t.Fatal(err)
				}
			}
			startClusterDNS(t, c)
			start := time.Now()
			r := runE2E(t, c, e2eRun{kubeDir: kubeDir, focus: focus, procs: procs})
			t.Logf("conformance (%s, kube-proxy %s, %d Ginkgo processes): %s", set, mode, procs, time.Since(start).Round(time.Second))
			r.report(t, mode)
			for _, err := range r.expect(set, os.Getenv("VILLAGE_CONFORMANCE_FOCUS") == "") {
				t.Errorf("kube-proxy %s: %v", mode, err)
			}
		})
	}
}

// startClusterDNS applies testdata/coredns.yaml and waits until CoreDNS
// is ready.
func startClusterDNS(t *testing.T, c *kubecluster.Cluster) {
	t.Helper()
	manifest, err := filepath.Abs(filepath.Join("testdata", "coredns.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("cluster DNS: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		d, err := c.Client().AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas >= 1 {
			return
		}
		select {
		case <-ctx.Done():
			out, _ := c.Kubectl("-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-dns")
			t.Fatalf("cluster DNS: CoreDNS not ready within %s (last error %v):\n%s", wait, err, out)
		case <-time.After(time.Second):
		}
	}
}

type e2eRun struct {
	kubeDir string
	focus   string
	procs   int
}

// runE2E runs e2e.test through the Ginkgo CLI inside the LAN namespace
// (its clients reach the API server and the nodes there only) and returns
// the parsed JUnit report. A non-zero exit with a report is judged by the
// report; without one it fails the test.
func runE2E(t *testing.T, c *kubecluster.Cluster, r e2eRun) junitResult {
	t.Helper()
	reportDir := t.TempDir()
	skips := make([]string, len(conformanceSkips))
	for i, s := range conformanceSkips {
		skips[i] = s.pattern
	}
	args := []string{
		"--procs=" + strconv.Itoa(r.procs), "--no-color", "--timeout=2h",
		"--focus=" + r.focus, "--skip=" + strings.Join(skips, "|"),
		filepath.Join(r.kubeDir, "e2e.test"), "--",
		"--provider=skeleton",
		"--num-nodes=" + strconv.Itoa(conformanceNodes),
		"--kubeconfig=" + c.Kubeconfig(),
		"--kubectl-path=" + filepath.Join(r.kubeDir, "kubectl"),
		"--report-dir=" + reportDir,
		"--disable-log-dump",
	}
	cmd := exec.Command(filepath.Join(r.kubeDir, "ginkgo"), args...)
	cmd.Dir = reportDir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig())
	logPath := filepath.Join(reportDir, "e2e.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	runErr := c.RunInLAN(cmd)
	res, perr := parseJUnit(reportDir, r.focus)
	if perr != nil || res.total() == 0 {
		t.Fatalf("e2e.test (%v) left no usable report (%v, %d tests):\n%s", runErr, perr, res.total(), fileTail(logPath))
	}
	if runErr != nil && len(res.failed) == 0 {
		t.Fatalf("e2e.test failed (%v) with no failed test in its report:\n%s", runErr, fileTail(logPath))
	}
	return res
}

// fileTail is the last 20000 bytes of a log.
func fileTail(p string) []byte {
	b, _ := os.ReadFile(p)
	if len(b) > 20000 {
		b = b[len(b)-20000:]
	}
	return b
}

// junitResult counts the tests of the focus.
type junitResult struct {
	passed, skipped []string
	failed          map[string]string // name -> failure message
	failedOrder     []string
}

func (r junitResult) total() int { return len(r.passed) + len(r.skipped) + len(r.failed) }

type junitCase struct {
	Name    string `xml:"name,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"error"`
}

// parseJUnit reads every junit*.xml e2e.test wrote into dir and keeps the
// test cases whose name matches focus (the report lists every spec of the
// suite, those outside the focus as skipped).
func parseJUnit(dir, focus string) (junitResult, error) {
	res := junitResult{failed: map[string]string{}}
	re, err := regexp.Compile(focus)
	if err != nil {
		return res, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "junit*.xml"))
	if err != nil || len(files) == 0 {
		return res, fmt.Errorf("no junit*.xml in %s", dir)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return res, err
		}
		var doc struct {
			Suites []struct {
				Cases []junitCase `xml:"testcase"`
			} `xml:"testsuite"`
			Cases []junitCase `xml:"testcase"` // a lone <testsuite> root
		}
		if err := xml.Unmarshal(b, &doc); err != nil {
			return res, fmt.Errorf("parse %s: %w", f, err)
		}
		cases := doc.Cases
		for _, s := range doc.Suites {
			cases = append(cases, s.Cases...)
		}
		for _, c := range cases {
			name := strings.TrimPrefix(c.Name, "[It] ")
			if !re.MatchString(name) {
				continue
			}
			switch {
			case c.Failure != nil:
				res.failed[name] = strings.TrimSpace(c.Failure.Message + "\n" + lastLines(c.Failure.Text, 15))
				res.failedOrder = append(res.failedOrder, name)
			case c.Error != nil:
				res.failed[name] = strings.TrimSpace(c.Error.Message + "\n" + lastLines(c.Error.Text, 15))
				res.failedOrder = append(res.failedOrder, name)
			case c.Skipped != nil:
				res.skipped = append(res.skipped, name)
			default:
				res.passed = append(res.passed, name)
			}
		}
	}
	return res, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// report prints the passed/failed/skipped table and every failure with
// its message, and fails the test on any failure.
func (r junitResult) report(t *testing.T, mode string) {
	t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, "\n| kube-proxy | passed | failed | skipped |\n|---|---|---|---|\n| %s | %d | %d | %d |\n", mode, len(r.passed), len(r.failed), len(r.skipped))
	for _, s := range r.skipped {
		fmt.Fprintf(&b, "skipped: %s (%s)\n", s, skipReason(s))
	}
	t.Log(b.String())
	for _, name := range r.failedOrder {
		t.Errorf("FAILED (kube-proxy %s): %s\n%s", mode, name, r.failed[name])
	}
}

func skipReason(name string) string {
	for _, s := range conformanceSkips {
		if regexp.MustCompile(s.pattern).MatchString(name) {
			return s.reason
		}
	}
	return selfSkip
}

const selfSkip = "skipped by the test itself"

// expect is what the report of set lacks: a test of the focus skipped for
// no reason of conformanceSkips (the suite skipped it itself), and with the
// set's own focus (setFocus) fewer passed tests than its floor or, in
// granular, a test of the Netpol subset that did not pass.
func (r junitResult) expect(set string, setFocus bool) []error {
	var errs []error
	for _, s := range r.skipped {
		if skipReason(s) == selfSkip {
			errs = append(errs, fmt.Errorf("%s: %s; only the tests of conformanceSkips may skip", s, selfSkip))
		}
	}
	if !setFocus {
		return errs
	}
	if floor := conformanceFloor[set]; len(r.passed) < floor {
		errs = append(errs, fmt.Errorf("set %s: %d tests passed, want at least %d", set, len(r.passed), floor))
	}
	if set == "granular" {
		for _, want := range netpolSubsetTests {
			if !slices.ContainsFunc(r.passed, func(n string) bool { return strings.HasPrefix(n, netpolPrefix+want+" ") }) {
				errs = append(errs, fmt.Errorf("set granular: the Netpol test %q did not pass", want))
			}
		}
	}
	return errs
}
