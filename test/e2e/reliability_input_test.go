package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/internal/testenv"
)

// hostile is one bad invocation of a plugin binary.
type hostile struct {
	name string
	// edit turns the good config (a JSON object) into the hostile one; nil
	// keeps it. raw, when set, replaces stdin entirely.
	edit  func(m map[string]any)
	raw   []byte
	call  testenv.Call // non-zero fields override the good call
	code  uint
	field string // the message must name this
}

func setIPAM(k string, v any) func(map[string]any) {
	return func(m map[string]any) { m["ipam"].(map[string]any)[k] = v }
}

func setRanges(r ...map[string]any) func(map[string]any) {
	return func(m map[string]any) {
		var sets []any
		for _, x := range r {
			sets = append(sets, []any{x})
		}
		m["ipam"].(map[string]any)["ranges"] = sets
	}
}

func nested(depth int) []byte {
	return []byte(`{"cniVersion":"1.1.0","name":"h","type":"village","x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "}")
}

// hostileCases is the table both binaries run (field names are the config's
// keys; the IPAM plugin names its own fields under "ipam.").
func hostileCases(bin string) []hostile {
	ipam := bin == "village-ipam"
	ipamField := func(f string) string { return "ipam." + f }
	cases := []hostile{
		{name: "not JSON", raw: []byte("{nope"), code: types.ErrDecodingFailure},
		{name: "NUL bytes instead of JSON", raw: []byte("\x00\x00\x00"), code: types.ErrDecodingFailure},
		{name: "deep JSON nesting", raw: nested(100_000), code: types.ErrDecodingFailure, field: "depth"},
		{name: "huge config", edit: func(m map[string]any) { m["pad"] = strings.Repeat("x", 64<<20) }, code: types.ErrInvalidNetworkConfig, field: "bytes"},
		{name: "NUL in name", edit: func(m map[string]any) { m["name"] = "h\x00../../x" }, code: types.ErrInvalidNetworkConfig, field: "name"},
		{name: "name is a path", edit: func(m map[string]any) { m["name"] = "../../escape" }, code: types.ErrInvalidNetworkConfig, field: "name"},
		{name: "name too long", edit: func(m map[string]any) { m["name"] = strings.Repeat("n", 300) }, code: types.ErrInvalidNetworkConfig, field: "name"},
		{name: "overlapping ranges", edit: setRanges(map[string]any{"subnet": "10.50.0.0/24"}, map[string]any{"subnet": "10.50.0.128/25"}), code: types.ErrInvalidNetworkConfig, field: ipamField("ranges")},
		{name: "rangeStart after rangeEnd", edit: setRanges(map[string]any{"subnet": "10.50.0.0/24", "rangeStart": "10.50.0.200", "rangeEnd": "10.50.0.100"}), code: types.ErrInvalidNetworkConfig, field: "rangeStart"},
		{name: "gateway outside the subnet", edit: setRanges(map[string]any{"subnet": "10.50.0.0/24", "gateway": "10.51.0.1"}), code: types.ErrInvalidNetworkConfig, field: "gateway"},
		{name: "rangeEnd outside the subnet", edit: setRanges(map[string]any{"subnet": "10.50.0.0/24", "rangeEnd": "10.50.1.9"}), code: types.ErrInvalidNetworkConfig, field: "rangeEnd"},
		{name: "IPv6 zone in subnet", edit: setRanges(map[string]any{"subnet": "fe80::%eth0/64"}), code: types.ErrInvalidNetworkConfig, field: "subnet"},
		{name: "IPv6 zone in gateway", edit: setRanges(map[string]any{"subnet": "fd50::/64", "gateway": "fd50::1%lo"}), code: types.ErrInvalidNetworkConfig, field: "gateway"},
		{name: "IPv6 zone in runtimeConfig.ips", edit: func(m map[string]any) { m["runtimeConfig"] = map[string]any{"ips": []string{"10.50.0.9%eth0"}} }, code: types.ErrInvalidNetworkConfig, field: "runtimeConfig.ips"},
		{name: "IPv6 zone in CNI_ARGS IP", call: testenv.Call{Args: "IP=fd50::9%eth0"}, code: types.ErrInvalidEnvironmentVariables, field: "IP"},
		{name: "subnet /32", edit: setRanges(map[string]any{"subnet": "10.50.0.1/32"}), code: types.ErrInvalidNetworkConfig, field: "subnet"},
		{name: "string where a list is", edit: setIPAM("ranges", "10.50.0.0/24"), code: types.ErrInvalidNetworkConfig, field: "ranges"},
		{name: "null route", edit: setIPAM("routes", []any{nil}), code: types.ErrInvalidNetworkConfig, field: "routes"},
		{name: "relative dataDir", edit: setIPAM("dataDir", "relative/dir"), code: types.ErrInvalidNetworkConfig, field: "dataDir"},
		{name: "container ID traversal", call: testenv.Call{ContainerID: "../../../etc"}, code: types.ErrInvalidEnvironmentVariables, field: "ontainer"},
		{name: "container ID with slash", call: testenv.Call{ContainerID: "a/b"}, code: types.ErrInvalidEnvironmentVariables, field: "ontainer"},
		{name: "container ID with NUL", call: testenv.Call{ContainerID: "abc\x01def"}, code: types.ErrInvalidEnvironmentVariables, field: "ontainer"},
		{name: "container ID too long", call: testenv.Call{ContainerID: strings.Repeat("c", 5000)}, code: types.ErrInvalidEnvironmentVariables, field: "ontainer"},
		{name: "ifname ..", call: testenv.Call{IfName: ".."}, code: types.ErrInvalidEnvironmentVariables, field: "interface name"},
		{name: "ifname traversal", call: testenv.Call{IfName: "../eth0"}, code: types.ErrInvalidEnvironmentVariables, field: "interface name"},
		{name: "ifname too long", call: testenv.Call{IfName: "eth0123456789abc"}, code: types.ErrInvalidEnvironmentVariables, field: "interface name"},
		{name: "ifname with colon", call: testenv.Call{IfName: "eth0:1"}, code: types.ErrInvalidEnvironmentVariables, field: "interface name"},
		{name: "ifname with space", call: testenv.Call{IfName: "eth 0"}, code: types.ErrInvalidEnvironmentVariables, field: "interface name"},
		{name: "unknown CNI_ARGS key", call: testenv.Call{Args: "EVIL=1"}, code: types.ErrInvalidEnvironmentVariables, field: "EVIL"},
		{name: "CNI_ARGS without =", call: testenv.Call{Args: "garbage"}, code: types.ErrInvalidEnvironmentVariables, field: "garbage"},
	}
	if ipam {
		// The IPAM plugin reports a bad CNI_ARGS as village does (code 4).
		return cases
	}
	return append(cases,
		hostile{name: "negative MTU", edit: func(m map[string]any) { m["mtu"] = -1 }, code: types.ErrInvalidNetworkConfig, field: "mtu"},
		hostile{name: "bridge with NUL", edit: func(m map[string]any) { m["bridge"] = "br\x00x" }, code: types.ErrInvalidNetworkConfig, field: "bridge"},
		hostile{name: "bridge traversal", edit: func(m map[string]any) { m["bridge"] = "../br" }, code: types.ErrInvalidNetworkConfig, field: "bridge"},
		hostile{name: "vlan out of range", edit: func(m map[string]any) { m["vlan"] = 5000 }, code: types.ErrInvalidNetworkConfig, field: "vlan"},
		hostile{name: "relative logFile", edit: func(m map[string]any) { m["logFile"] = "../log" }, code: types.ErrInvalidNetworkConfig, field: "logFile"},
		hostile{name: "ipam.type traversal", edit: setIPAM("type", "../../../bin/sh"), code: types.ErrInvalidNetworkConfig, field: "ipam.type"},
		hostile{name: "netns is a regular file", call: testenv.Call{Netns: "REGULAR"}, code: types.ErrInvalidEnvironmentVariables, field: "CNI_NETNS"},
		hostile{name: "netns is the host's own", call: testenv.Call{Netns: "/proc/self/ns/net"}, code: types.ErrInvalidNetNS, field: "own network namespace"},
		hostile{name: "netns is a directory", call: testenv.Call{Netns: "/"}, code: types.ErrInvalidEnvironmentVariables, field: "CNI_NETNS"},
		hostile{name: "backend vni out of range", edit: func(m map[string]any) { m["backend"] = map[string]any{"type": "vxlan", "vni": 1 << 25} }, code: types.ErrInvalidNetworkConfig, field: "vni"},
		hostile{name: "macvlan master traversal", edit: func(m map[string]any) {
			m["macvlan"] = map[string]any{"master": "../eth0", "ipam": map[string]any{"type": "village-ipam", "subnet": "192.168.50.0/24"}}
		}, code: types.ErrInvalidNetworkConfig, field: "master"},
		hostile{name: "macvlan ifName is CNI_IFNAME", edit: func(m map[string]any) {
			m["macvlan"] = map[string]any{"ifName": "eth0", "ipam": map[string]any{"type": "village-ipam", "dataDir": m["ipam"].(map[string]any)["dataDir"], "subnet": "192.168.50.0/24"}}
		}, code: types.ErrInvalidNetworkConfig, field: "CNI_IFNAME"},
	)
}

// TestHostileInputThroughBinaries runs every hostile input through the real
// village and village-ipam binaries, for ADD (and DEL where the input is
// the environment): each must print a CNI error JSON on stdout with the
// expected code and a message naming the field, exit non-zero, not panic,
// leave no interface and no allocation, and write nothing outside the data
// directory.
func TestHostileInputThroughBinaries(t *testing.T) {
	n := NewNode(t)
	pod := n.NewPod()
	// The data dir is deep inside the test dir, so that a path escaping it
	// would still land where the test looks.
	data := filepath.Join(n.Dir, "a", "b", "ipam")
	regular := filepath.Join(n.Dir, "regular-file")
	must(t, os.WriteFile(regular, []byte("x"), 0o600), "write")
	cwd := t.TempDir()
	tried := 0
	for _, bin := range []string{"village", "village-ipam"} {
		t.Run(bin, func(t *testing.T) {
			for _, c := range hostileCases(bin) {
				t.Run(c.name, func(t *testing.T) {
					t.Chdir(cwd) // where a relative path from the input would land
					before := files(t, n.Dir)
					beforeCwd := files(t, cwd)
					good := map[string]any{"cniVersion": "1.1.0", "name": "hostile", "type": bin, "bridge": "hostile0", "isGateway": true,
						"ipam": map[string]any{"type": "village-ipam", "dataDir": data, "ranges": []any{[]any{map[string]any{"subnet": "10.50.0.0/24"}}}}}
					if c.edit != nil {
						c.edit(good)
					}
					stdin := c.raw
					if stdin == nil {
						var err error
						stdin, err = json.Marshal(good)
						must(t, err, "marshal")
					}
					verbs := []string{"ADD"}
					if c.call.ContainerID != "" || c.call.IfName != "" {
						verbs = append(verbs, "DEL")
					}
					for _, verb := range verbs {
						call := testenv.Call{Bin: bin, Command: verb, ContainerID: "hostile-ctr", Netns: pod.NS.Path(), IfName: "eth0", Stdin: stdin, Args: c.call.Args}
						if c.call.ContainerID != "" {
							call.ContainerID = c.call.ContainerID
						}
						if c.call.IfName != "" {
							call.IfName = c.call.IfName
						}
						switch c.call.Netns {
						case "":
						case "REGULAR":
							call.Netns = regular
						default:
							call.Netns = c.call.Netns
						}
						call.Path = testenv.CNIPath(t)
						call.Bin = filepath.Join(testenv.Bins(t), bin)
						call.In = n.NS
						out := testenv.Exec(t, call)
						tried++
						e := CNIError(t, out)
						if e.Code != c.code {
							t.Errorf("%s: code %d (%s), want %d", verb, e.Code, e.Msg, c.code)
						}
						if c.field != "" && !strings.Contains(e.Msg+" "+e.Details, c.field) {
							t.Errorf("%s: message %q does not name %q", verb, truncate(e.Msg, 300), c.field)
						}
					}
					if left := ipFiles(t, data); len(left) != 0 {
						t.Fatalf("allocations after a rejected input: %v", left)
					}
					if out := testenv.MustIP(t, pod.NS, "-o", "link"); strings.Contains(out, "eth0") {
						t.Fatalf("a rejected input left eth0: %s", out)
					}
					for _, f := range files(t, n.Dir) {
						if !slices.Contains(before, f) && !strings.HasPrefix(f, "a/b/ipam/") {
							t.Fatalf("a rejected input wrote %s outside the data dir", f)
						}
					}
					if got := files(t, cwd); !slices.Equal(got, beforeCwd) {
						t.Fatalf("a rejected input wrote %v in the plugin's working directory", got)
					}
				})
			}
		})
	}
	t.Logf("%d hostile invocations, every one a clean CNI error", tried)

	// Unknown config keys are not hostile: the spec lets runtimes and
	// conflist authors add keys plugins ignore.
	l := ConfList(t, fmt.Sprintf(`{"cniVersion":"1.1.0","name":"unknown","plugins":[{"type":"village","bridge":"unk0","noSuchKey":{"deep":[1,2]},
		"ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.50.1.0/24"}]],"alsoUnknown":true}}]}`, data))
	p := n.NewPod()
	n.MustAdd(l, p)
	must(t, n.Del(l, p), "DEL")
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
