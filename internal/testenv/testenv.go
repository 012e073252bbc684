// Package testenv gives Village's tests the real things they run against:
// freshly built plugin binaries (Village's own and the reference plugins from
// the module cache), network namespaces that are removed when the test ends,
// and a way to exec a plugin exactly as a container runtime does.
//
// Every namespace a test makes comes from NewNS; nothing here touches the
// machine's own network namespace. Tests that need root fail (not skip) when
// they are not root, because CI and the development machines are root.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// RequireRoot fails the test when it does not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (it makes network namespaces); run the README's test command as root")
	}
}

// EnvCount is the count a benchmark reads from the environment variable
// name: its value when that is a number no smaller than least, else def.
func EnvCount(name string, def, least int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= least {
		return v
	}
	return def
}

// ModuleRoot returns the directory holding the project's go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

var (
	buildOnce sync.Once
	binDir    string
	refDir    string
	buildErr  error
)

func build() {
	root, err := ModuleRoot()
	if err != nil {
		buildErr = err
		return
	}
	// VILLAGE_BIN_DIR / VILLAGE_REF_BIN_DIR let a test run reuse binaries that
	// build_linux.sh already made; otherwise build into a temp dir once per
	// test process (the go build cache keeps repeats cheap).
	binDir = os.Getenv("VILLAGE_BIN_DIR")
	refDir = os.Getenv("VILLAGE_REF_BIN_DIR")
	tmp, err := os.MkdirTemp("", "village-testbin-")
	if err != nil {
		buildErr = err
		return
	}
	if binDir == "" {
		binDir = filepath.Join(tmp, "village")
		pkgs := []string{"./plugins/..."}
		if _, err := os.Stat(filepath.Join(root, "cmd")); err == nil {
			pkgs = append(pkgs, "./cmd/...")
		}
		if buildErr = goBuild(root, binDir, pkgs...); buildErr != nil {
			return
		}
	}
	if refDir == "" {
		refDir = filepath.Join(tmp, "ref")
		buildErr = goBuild(root, refDir, "tool")
	}
}

func goBuild(root, out string, pkgs ...string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	args := append([]string{"build", "-trimpath", "-tags", BuildTags, "-o", out + "/"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// BuildTags are the build tags of Village's binaries, as build_linux.sh
// gives them: grpcnotrace keeps gRPC's golang.org/x/net/trace out of the
// binaries that link the etcd client. That package imports html/template,
// whose reflective method calls make the linker keep every exported method
// of every linked type: villaged was 65 MB with it, 37.5 MB without.
const BuildTags = "grpcnotrace"

// Bins returns a directory holding Village's binaries (village, village-ipam,
// loopback, and villaged once it exists), built once per test process.
func Bins(t testing.TB) string {
	t.Helper()
	mustBuild(t)
	return binDir
}

// mustBuild builds both binary directories once per test process and fails
// the test when that did not work.
func mustBuild(t testing.TB) {
	t.Helper()
	buildOnce.Do(build)
	if buildErr != nil {
		t.Fatalf("building binaries: %v", buildErr)
	}
}

// RefBins returns a directory holding the reference plugins (bridge,
// host-local, macvlan, loopback, portmap, bandwidth, tuning, firewall) and
// cnitool, built from the module cache at the versions go.mod pins.
func RefBins(t testing.TB) string {
	t.Helper()
	mustBuild(t)
	return refDir
}

// CNIPath is the CNI_PATH a test runtime uses: Village's binaries first, then
// the reference plugins (so "loopback" means Village's loopback).
func CNIPath(t testing.TB) string {
	return Bins(t) + ":" + RefBins(t)
}

// NewNS makes a new network namespace (bind-mounted under /run/netns) with
// its loopback up, and removes it when the test ends, pass or fail.
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	if out, err := exec.Command("ip", "-n", filepath.Base(n.Path()), "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", n.Path(), err, out)
	}
	return n
}

// Call is one plugin invocation, described the way a runtime sets it up.
type Call struct {
	Bin         string // absolute path of the plugin binary
	Command     string // CNI_COMMAND
	ContainerID string
	Netns       string
	IfName      string
	Args        string // CNI_ARGS
	Path        string // CNI_PATH
	Stdin       []byte
	In          ns.NetNS // run the plugin inside this namespace (the test "node"); nil: current
	Env         []string // extra environment
}

// Output is what a plugin process produced.
type Output struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// Exec runs the plugin with only the CNI environment (as runtimes do) and
// returns what it printed and its exit code. It fails the test only when the
// process could not be started at all.
func Exec(t testing.TB, c Call) Output {
	t.Helper()
	env := []string{
		"CNI_COMMAND=" + c.Command,
		"CNI_CONTAINERID=" + c.ContainerID,
		"CNI_NETNS=" + c.Netns,
		"CNI_IFNAME=" + c.IfName,
		"CNI_ARGS=" + c.Args,
		"CNI_PATH=" + c.Path,
		"PATH=" + os.Getenv("PATH"),
	}
	env = append(env, c.Env...)
	var out Output
	run := func() error {
		cmd := exec.Command(c.Bin)
		cmd.Env = env
		cmd.Stdin = bytes.NewReader(c.Stdin)
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		err := cmd.Run()
		out.Stdout, out.Stderr = so.Bytes(), se.Bytes()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			out.ExitCode = ee.ExitCode()
			return nil
		}
		return err
	}
	var err error
	if c.In != nil {
		err = InNS(c.In, run)
	} else {
		err = run()
	}
	if err != nil {
		t.Fatalf("exec %s: %v", c.Bin, err)
	}
	return out
}

// InNS runs f on an OS thread switched into n; processes started by f
// (plugins, ip, ping) inherit that namespace.
func InNS(n ns.NetNS, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return n.Do(func(ns.NetNS) error { return f() })
}

// IP runs `ip args...` inside n and returns its combined output.
func IP(n ns.NetNS, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"-n", filepath.Base(n.Path())}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s in %s: %w: %s", strings.Join(args, " "), n.Path(), err, out)
	}
	return string(out), nil
}

// MustIP is IP that fails the test on error.
func MustIP(t testing.TB, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := IP(n, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Ping sends count pings from inside n to dst and returns an error naming both
// ends when none is answered. dst must be an address inside namespaces the
// test made.
func Ping(n ns.NetNS, dst string, count int) error {
	args := []string{"netns", "exec", filepath.Base(n.Path()), "ping", "-c", fmt.Sprint(count), "-W", "2", "-i", "0.2"}
	if strings.Contains(dst, ":") {
		args = append(args, "-6")
	}
	out, err := exec.Command("ip", append(args, dst)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %w: %s", dst, n.Path(), err, out)
	}
	return nil
}
