package plugin_test

// These tests run the real village-ipam binary (and the reference host-local)
// the way a runtime does. IPAM needs no network namespace, so CNI_NETNS is
// just a path string and nothing here touches the network.

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/internal/testenv"
	"github.com/village-cni/village/pkg/ipam/plugin"
)

type netConf struct {
	Version string
	DataDir string
	// IPAM holds extra ipam keys (raw JSON members, no braces).
	IPAM string
	// Top holds extra top-level members.
	Top string
}

func (c netConf) bytes() []byte {
	v := c.Version
	if v == "" {
		v = "1.1.0"
	}
	ipam := c.IPAM
	if ipam == "" {
		ipam = `"ranges":[[{"subnet":"10.10.0.0/24"}],[{"subnet":"fd10::/64"}]],"routes":[{"dst":"0.0.0.0/0"}]`
	}
	top := ""
	if c.Top != "" {
		top = "," + c.Top
	}
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"testnet","type":"village","ipam":{"type":"village-ipam","dataDir":%q,%s}%s}`, v, c.DataDir, ipam, top))
}

type call struct {
	bin, cmd, id, ifname, args string
	stdin                      []byte
	env                        []string
}

func run(t *testing.T, c call) testenv.Output {
	t.Helper()
	if c.bin == "" {
		c.bin = filepath.Join(testenv.Bins(t), "village-ipam")
	}
	if c.ifname == "" && c.id != "" {
		c.ifname = "eth0"
	}
	netns := ""
	if c.cmd == "ADD" || c.cmd == "CHECK" {
		netns = "/var/run/netns/not-used-by-ipam"
	}
	return testenv.Exec(t, testenv.Call{Bin: c.bin, Command: c.cmd, ContainerID: c.id, IfName: c.ifname, Netns: netns,
		Args: c.args, Path: testenv.Bins(t), Stdin: c.stdin, Env: c.env})
}

func mustOK(t *testing.T, out testenv.Output, what string) {
	t.Helper()
	if out.ExitCode != 0 {
		t.Fatalf("%s: exit %d, stdout %s, stderr %s", what, out.ExitCode, out.Stdout, out.Stderr)
	}
}

func cniErr(t *testing.T, out testenv.Output, code uint, contains string) *types.Error {
	t.Helper()
	if out.ExitCode == 0 {
		t.Fatalf("succeeded, want code %d; stdout %s", code, out.Stdout)
	}
	var e types.Error
	if err := json.Unmarshal(out.Stdout, &e); err != nil {
		t.Fatalf("stdout is not a CNI error (%v): %s / %s", err, out.Stdout, out.Stderr)
	}
	if e.Code != code || !strings.Contains(e.Msg+" "+e.Details, contains) {
		t.Fatalf("got code %d %q (%s), want code %d containing %q", e.Code, e.Msg, e.Details, code, contains)
	}
	return &e
}

func addResult(t *testing.T, out testenv.Output, wantVersion string) *current.Result {
	t.Helper()
	mustOK(t, out, "ADD")
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(out.Stdout, &v); err != nil || v.CNIVersion != wantVersion {
		t.Fatalf("result cniVersion %q (%v), want %q: %s", v.CNIVersion, err, wantVersion, out.Stdout)
	}
	r, err := create.Create(wantVersion, out.Stdout)
	if err != nil {
		t.Fatalf("parsing %s result: %v\n%s", wantVersion, err, out.Stdout)
	}
	cr, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	return cr
}

func addrs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address.String())
	}
	return strings.Join(s, " ")
}

func TestBinaryVersion(t *testing.T) {
	out := run(t, call{cmd: "VERSION", stdin: []byte(`{"cniVersion":"1.1.0"}`)})
	mustOK(t, out, "VERSION")
	var pi struct {
		Supported []string `json:"supportedVersions"`
	}
	json.Unmarshal(out.Stdout, &pi)
	if !slices.Equal(pi.Supported, version.All.SupportedVersions()) || !slices.Contains(pi.Supported, "0.1.0") || !slices.Contains(pi.Supported, "1.1.0") {
		t.Fatalf("VERSION %s", out.Stdout)
	}
	about := run(t, call{cmd: ""})
	if about.ExitCode != 0 || !strings.Contains(string(about.Stderr), "village-ipam") {
		t.Fatalf("about: %d %s", about.ExitCode, about.Stderr)
	}
}

// TestBinaryEveryVersion runs ADD, repeated ADD, CHECK, DEL, repeated DEL in
// every CNI version, dual stack, and checks the result's format.
func TestBinaryEveryVersion(t *testing.T) {
	for _, v := range version.All.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			dir := t.TempDir()
			resolv := filepath.Join(dir, "resolv.conf")
			os.WriteFile(resolv, []byte("# x\nnameserver 10.0.0.53\nsearch a.example b.example\noptions ndots:2\n"), 0o600)
			c := netConf{Version: v, DataDir: dir, IPAM: fmt.Sprintf(`"ranges":[[{"subnet":"10.10.0.0/24"}],[{"subnet":"fd10::/64"}]],"routes":[{"dst":"0.0.0.0/0"}],"resolvConf":%q`, resolv)}
			r := addResult(t, run(t, call{cmd: "ADD", id: "ctr1", stdin: c.bytes()}), v)
			if addrs(r) != "10.10.0.2/24 fd10::2/64" || r.IPs[0].Gateway.String() != "10.10.0.1" || r.IPs[1].Gateway.String() != "fd10::1" {
				t.Fatalf("result %s", addrs(r))
			}
			if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "0.0.0.0/0" {
				t.Fatalf("routes %v", r.Routes)
			}
			if !slices.Equal(r.DNS.Nameservers, []string{"10.0.0.53"}) || len(r.DNS.Search) != 2 {
				t.Fatalf("dns %+v", r.DNS)
			}
			again := addResult(t, run(t, call{cmd: "ADD", id: "ctr1", stdin: c.bytes()}), v)
			if addrs(again) != addrs(r) {
				t.Fatalf("repeated ADD %s, first %s", addrs(again), addrs(r))
			}
			other := addResult(t, run(t, call{cmd: "ADD", id: "ctr2", stdin: c.bytes()}), v)
			if addrs(other) != "10.10.0.3/24 fd10::3/64" {
				t.Fatalf("second container %s", addrs(other))
			}
			if ok, _ := version.GreaterThanOrEqualTo(v, "0.4.0"); ok {
				mustOK(t, run(t, call{cmd: "CHECK", id: "ctr1", stdin: c.bytes()}), "CHECK")
			} else {
				cniErr(t, run(t, call{cmd: "CHECK", id: "ctr1", stdin: c.bytes()}), types.ErrIncompatibleCNIVersion, "CHECK")
			}
			mustOK(t, run(t, call{cmd: "DEL", id: "ctr1", stdin: c.bytes()}), "DEL")
			mustOK(t, run(t, call{cmd: "DEL", id: "ctr1", stdin: c.bytes()}), "repeated DEL")
			mustOK(t, run(t, call{cmd: "DEL", id: "never-added", stdin: c.bytes()}), "DEL of nothing")
			if ok, _ := version.GreaterThanOrEqualTo(v, "0.4.0"); ok {
				cniErr(t, run(t, call{cmd: "CHECK", id: "ctr1", stdin: c.bytes()}), plugin.ErrCodeNoAllocation, "holds no address")
			}
			if _, err := os.Stat(filepath.Join(dir, "testnet", "10.10.0.2")); !os.IsNotExist(err) {
				t.Fatalf("10.10.0.2 still reserved after DEL: %v", err)
			}
		})
	}
}

func TestBinaryCheckPrevResult(t *testing.T) {
	dir := t.TempDir()
	c := netConf{DataDir: dir}
	r := addResult(t, run(t, call{cmd: "ADD", id: "ctr1", stdin: c.bytes()}), "1.1.0")
	prev, _ := json.Marshal(r)
	c.Top = `"prevResult":` + string(prev)
	mustOK(t, run(t, call{cmd: "CHECK", id: "ctr1", stdin: c.bytes()}), "CHECK with prevResult")
	c.Top = strings.Replace(c.Top, "10.10.0.2", "10.10.0.77", 1)
	cniErr(t, run(t, call{cmd: "CHECK", id: "ctr1", stdin: c.bytes()}), plugin.ErrCodeNoAllocation, "prevResult has 10.10.0.77")
}

func TestBinaryRequestedIPs(t *testing.T) {
	dir := t.TempDir()
	c := netConf{DataDir: dir, Top: `"runtimeConfig":{"ips":["fd10::99/64"]},"args":{"cni":{"ips":["10.10.0.50"]}}`}
	r := addResult(t, run(t, call{cmd: "ADD", id: "ctr1", stdin: c.bytes()}), "1.1.0")
	if addrs(r) != "10.10.0.50/24 fd10::99/64" {
		t.Fatalf("got %s", addrs(r))
	}
	c2 := netConf{DataDir: dir}
	cniErr(t, run(t, call{cmd: "ADD", id: "ctr2", args: "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.10.0.50", stdin: c2.bytes()}),
		plugin.ErrCodeAddressUnavailable, "requested address 10.10.0.50 is already allocated")
	cniErr(t, run(t, call{cmd: "ADD", id: "ctr2", args: "IP=10.10.0.1", stdin: c2.bytes()}), plugin.ErrCodeAddressUnavailable, "10.10.0.1 is the gateway")
	if e := cniErr(t, run(t, call{cmd: "ADD", id: "ctr2", args: "IP=10.99.0.1", stdin: c2.bytes()}), plugin.ErrCodeAddressUnavailable, "10.99.0.1 is outside every range"); e.Details != plugin.DetailOutsidePool {
		t.Errorf("an address outside every range: details %q, want %q", e.Details, plugin.DetailOutsidePool)
	}
	// The failed requests left nothing behind for ctr2.
	r = addResult(t, run(t, call{cmd: "ADD", id: "ctr2", args: "IP=10.10.0.51", stdin: c2.bytes()}), "1.1.0")
	if addrs(r) != "10.10.0.51/24 fd10::9a/64" { // round-robin continues after fd10::99
		t.Fatalf("got %s", addrs(r))
	}
}

// TestBinaryParallelFill starts 40 processes at once on a 40-address range:
// every one gets a distinct address, the 41st fails naming the range, and
// STATUS reports the plugin unavailable.
func TestBinaryParallelFill(t *testing.T) {
	dir := t.TempDir()
	c := netConf{DataDir: dir, IPAM: `"ranges":[[{"subnet":"10.20.0.0/24","rangeStart":"10.20.0.10","rangeEnd":"10.20.0.49"}]]`}
	bin := filepath.Join(testenv.Bins(t), "village-ipam")
	outs := make([]testenv.Output, 40)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() { outs[i] = run(t, call{bin: bin, cmd: "ADD", id: fmt.Sprintf("par%02d", i), stdin: c.bytes()}) })
	}
	wg.Wait()
	seen := map[string]string{}
	for i, o := range outs {
		r := addResult(t, o, "1.1.0")
		a := addrs(r)
		if prev, dup := seen[a]; dup {
			t.Fatalf("%s handed to par%02d and %s", a, i, prev)
		}
		seen[a] = fmt.Sprintf("par%02d", i)
	}
	for i := 10; i <= 49; i++ {
		if _, ok := seen[fmt.Sprintf("10.20.0.%d/24", i)]; !ok {
			t.Fatalf("10.20.0.%d not handed out", i)
		}
	}
	cniErr(t, run(t, call{cmd: "ADD", id: "one-too-many", stdin: c.bytes()}), plugin.ErrCodeExhausted,
		`no free address in range 10.20.0.10-10.20.0.49 of network "testnet"`)
	cniErr(t, run(t, call{cmd: "STATUS", stdin: c.bytes()}), types.ErrPluginNotAvailable, "no free address in range 10.20.0.10-10.20.0.49")
	mustOK(t, run(t, call{cmd: "DEL", id: "par07", stdin: c.bytes()}), "DEL")
	mustOK(t, run(t, call{cmd: "STATUS", stdin: c.bytes()}), "STATUS after DEL")
}

func TestBinaryLockBusy(t *testing.T) {
	dir := t.TempDir()
	c := netConf{DataDir: dir}
	mustOK(t, run(t, call{cmd: "ADD", id: "ctr1", stdin: c.bytes()}), "ADD")
	lock := filepath.Join(dir, "testnet", "lock")
	f, err := os.Open(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	env := []string{plugin.LockTimeoutEnv + "=300ms"}
	cniErr(t, run(t, call{cmd: "ADD", id: "ctr2", stdin: c.bytes(), env: env}), types.ErrTryAgainLater, lock)
	cniErr(t, run(t, call{cmd: "DEL", id: "ctr1", stdin: c.bytes(), env: env}), types.ErrTryAgainLater, lock)
	cniErr(t, run(t, call{cmd: "ADD", id: "ctr2", stdin: c.bytes(), env: []string{plugin.LockTimeoutEnv + "=soon"}}), types.ErrInvalidEnvironmentVariables, plugin.LockTimeoutEnv)
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	mustOK(t, run(t, call{cmd: "ADD", id: "ctr2", stdin: c.bytes(), env: env}), "ADD after unlock")
}

func TestBinaryBadInputs(t *testing.T) {
	dir := t.TempDir()
	good := netConf{DataDir: dir}.bytes()
	cases := []struct {
		name     string
		c        call
		code     uint
		contains string
	}{
		{"not json", call{cmd: "ADD", id: "c", stdin: []byte("{nope")}, types.ErrDecodingFailure, "unmarshal"},
		{"missing name", call{cmd: "ADD", id: "c", stdin: []byte(`{"cniVersion":"1.1.0","ipam":{"subnet":"10.0.0.0/24"}}`)}, types.ErrInvalidNetworkConfig, "name"},
		{"bad subnet", call{cmd: "ADD", id: "c", stdin: netConf{DataDir: dir, IPAM: `"subnet":"10.0.0.0/33"`}.bytes()}, types.ErrInvalidNetworkConfig, "ipam.subnet"},
		{"subnet too small", call{cmd: "ADD", id: "c", stdin: netConf{DataDir: dir, IPAM: `"ranges":[[{"subnet":"fd00::/127"}]]`}.bytes()}, types.ErrInvalidNetworkConfig, "ipam.ranges[0][0].subnet"},
		{"wrong type", call{cmd: "ADD", id: "c", stdin: netConf{DataDir: dir, IPAM: `"subnet":5`}.bytes()}, types.ErrInvalidNetworkConfig, "subnet"},
		{"container id ../x", call{cmd: "ADD", id: "../x", stdin: good}, types.ErrInvalidEnvironmentVariables, "containerID"},
		{"ifname with /", call{cmd: "ADD", id: "c", ifname: "a/b", stdin: good}, types.ErrInvalidEnvironmentVariables, "interface name"},
		{"DEL container id ../x", call{cmd: "DEL", id: "../x", stdin: good}, types.ErrInvalidEnvironmentVariables, "containerID"},
		{"unsupported version", call{cmd: "ADD", id: "c", stdin: netConf{Version: "9.9.9", DataDir: dir}.bytes()}, types.ErrIncompatibleCNIVersion, "incompatible"},
		{"CHECK in 0.3.1", call{cmd: "CHECK", id: "c", stdin: netConf{Version: "0.3.1", DataDir: dir}.bytes()}, types.ErrIncompatibleCNIVersion, "CHECK"},
		{"GC in 1.0.0", call{cmd: "GC", stdin: netConf{Version: "1.0.0", DataDir: dir}.bytes()}, types.ErrIncompatibleCNIVersion, "GC"},
		{"STATUS in 1.0.0", call{cmd: "STATUS", stdin: netConf{Version: "1.0.0", DataDir: dir}.bytes()}, types.ErrIncompatibleCNIVersion, "STATUS"},
		{"unknown command", call{cmd: "FROB", stdin: good}, types.ErrInvalidEnvironmentVariables, "FROB"},
		{"unknown CNI_ARGS", call{cmd: "ADD", id: "c", args: "FOO=bar", stdin: good}, types.ErrInvalidEnvironmentVariables, "CNI_ARGS"},
		{"etcd store unreachable (served by village-ipam-etcd)", call{cmd: "ADD", id: "c", stdin: netConf{DataDir: dir, IPAM: `"subnet":"10.0.0.0/24","store":{"type":"etcd","endpoints":["https://127.0.0.1:2379"]}`}.bytes()}, types.ErrTryAgainLater, "etcd at [https://127.0.0.1:2379] unreachable"},
		{"unknown store", call{cmd: "ADD", id: "c", stdin: netConf{DataDir: dir, IPAM: `"subnet":"10.0.0.0/24","store":{"type":"zk"}`}.bytes()}, types.ErrInvalidNetworkConfig, "ipam.store.type"},
		{"GC without attachments", call{cmd: "GC", stdin: good}, types.ErrInvalidNetworkConfig, "valid-attachments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cniErr(t, run(t, tc.c), tc.code, tc.contains)
		})
	}
}

func TestBinaryGC(t *testing.T) {
	dir := t.TempDir()
	c := netConf{DataDir: dir}
	for _, id := range []string{"keep", "drop1", "drop2"} {
		mustOK(t, run(t, call{cmd: "ADD", id: id, stdin: c.bytes()}), "ADD "+id)
	}
	mustOK(t, run(t, call{cmd: "ADD", id: "keep", ifname: "net1", stdin: c.bytes()}), "ADD keep/net1")
	gc := netConf{DataDir: dir, Top: `"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"},{"containerID":"gone","ifname":"eth0"}]`}
	mustOK(t, run(t, call{cmd: "GC", stdin: gc.bytes()}), "GC")
	left := reservations(t, filepath.Join(dir, "testnet"))
	if left != "10.10.0.2 fd10::2" {
		t.Fatalf("after GC: %s", left)
	}
	mustOK(t, run(t, call{cmd: "CHECK", id: "keep", stdin: c.bytes()}), "CHECK keep")
	// The older key works too; an empty list releases everything.
	old := netConf{DataDir: dir, Top: `"cni.dev/attachments":[]`}
	mustOK(t, run(t, call{cmd: "GC", stdin: old.bytes()}), "GC old key")
	if left := reservations(t, filepath.Join(dir, "testnet")); left != "" {
		t.Fatalf("after GC []: %s", left)
	}
}

func reservations(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			out = append(out, e.Name())
		}
	}
	return strings.Join(out, " ")
}

func TestBinaryStatus(t *testing.T) {
	dir := t.TempDir()
	mustOK(t, run(t, call{cmd: "STATUS", stdin: netConf{DataDir: dir}.bytes()}), "STATUS")
	// dataDir below a regular file cannot be created.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	cniErr(t, run(t, call{cmd: "STATUS", stdin: netConf{DataDir: filepath.Join(file, "data")}.bytes()}), types.ErrPluginNotAvailable, "store")
}

// TestBinaryWritesOnlyInDataDir runs every verb and checks no file appeared
// outside dataDir (the test's working directory included).
func TestBinaryWritesOnlyInDataDir(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	c := netConf{DataDir: data, Top: `"cni.dev/valid-attachments":[]`}
	cwd, _ := os.Getwd()
	before := listTree(t, cwd)
	for _, cmd := range []string{"ADD", "CHECK", "STATUS", "DEL", "ADD", "GC"} {
		mustOK(t, run(t, call{cmd: cmd, id: "ctr1", stdin: c.bytes()}), cmd)
	}
	cniErr(t, run(t, call{cmd: "ADD", id: "ctr1", stdin: []byte(strings.Replace(string(c.bytes()), `"testnet"`, `"../escape"`, 1))}), types.ErrInvalidNetworkConfig, "network name")
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p != root && p != data && !strings.HasPrefix(p, data+"/") {
			t.Errorf("file outside dataDir: %s", p)
		}
		if !d.IsDir() && p != root {
			if fi, _ := d.Info(); fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s mode %v is readable by others", p, fi.Mode())
			}
		}
		return nil
	})
	if after := listTree(t, cwd); after != before {
		t.Errorf("the working directory changed:\n%s\n->\n%s", before, after)
	}
}

func listTree(t *testing.T, dir string) string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		out = append(out, p)
		return nil
	})
	return strings.Join(out, "\n")
}
