package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/internal/testenv"
)

// logLines reads a plugin log file: one JSON object per line.
func logLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("log file: %v", err)
	}
	defer f.Close()
	var out []map[string]any
	s := bufio.NewScanner(f)
	for s.Scan() {
		m := map[string]any{}
		if err := json.Unmarshal(s.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON (%v): %q", err, s.Text())
		}
		out = append(out, m)
	}
	return out
}

func findLine(lines []map[string]any, plugin, msg, containerID string) map[string]any {
	for _, l := range lines {
		if l["plugin"] == plugin && l["msg"] == msg && l["containerID"] == containerID {
			return l
		}
	}
	return nil
}

// loggedList is a village + village-ipam conflist with logFile set on the
// village entry (village-ipam gets the same config and logs too) and a
// loopback entry logging to the same file.
func loggedList(n *Node, name, subnet, logFile, level string) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[
		{"type":"loopback","logFile":%q,"logLevel":%q},
		{"type":"village","bridge":"vlg-%s","isGateway":true,"logFile":%q,"logLevel":%q,
		 "ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":%q}]]}}]}`,
		name, logFile, level, name, logFile, level, filepath.Join(n.Dir, "ipam"), subnet)
}

func TestLogOneLinePerVerbThroughLibcni(t *testing.T) {
	n := NewNode(t)
	logFile := filepath.Join(n.Dir, "log", "cni.log")
	must(t, os.MkdirAll(filepath.Dir(logFile), 0o700), "mkdir")
	l := ConfList(t, loggedList(n, "logged", "10.41.0.0/24", logFile, "info"))
	p := n.NewPod()
	res := n.MustAdd(l, p)
	must(t, n.Check(l, p), "CHECK")
	must(t, n.Del(l, p), "DEL")

	lines := logLines(t, logFile)
	add := findLine(lines, "village", "ADD ok", p.ID)
	if add == nil {
		t.Fatalf("no village ADD line for %s in %v", p.ID, lines)
	}
	if add["network"] != "logged" || add["ifname"] != "eth0" || add["result"] != "ok" || add["level"] != "INFO" {
		t.Errorf("village ADD line: %v", add)
	}
	// The line names exactly the addresses of the result (the pod's, and
	// whatever a plugin earlier in the chain reported).
	var want []any
	for _, ip := range res.IPs {
		want = append(want, ip.Address.String())
	}
	if ips, _ := add["ips"].([]any); fmt.Sprint(ips) != fmt.Sprint(want) || !strings.Contains(fmt.Sprint(ips), "10.41.0.") {
		t.Errorf("ADD line ips %v, result %v", add["ips"], want)
	}
	if d, ok := add["duration_ms"].(float64); !ok || d <= 0 {
		t.Errorf("ADD line duration: %v", add["duration_ms"])
	}
	for _, want := range []struct{ plugin, msg string }{
		{"village-ipam", "ADD ok"}, {"loopback", "ADD ok"},
		{"village", "CHECK ok"}, {"village-ipam", "CHECK ok"},
		{"village", "DEL ok"}, {"village-ipam", "DEL ok"}, {"loopback", "DEL ok"},
	} {
		if findLine(lines, want.plugin, want.msg, p.ID) == nil {
			t.Errorf("no %s %q line for %s", want.plugin, want.msg, p.ID)
		}
	}
	if fi, err := os.Stat(logFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("log file mode %v (%v), want 0600", fi.Mode(), err)
	}
}

// TestLogKeepsStdoutForTheResult runs the village binary by hand, as a
// runtime does, with logging on at debug: stdout must be exactly one JSON
// document (the result, or the error), and a failure's log line names the
// container.
func TestLogKeepsStdoutForTheResult(t *testing.T) {
	n := NewNode(t)
	logFile := filepath.Join(n.Dir, "cni.log")
	stdin := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"raw","type":"village","bridge":"vlg-raw","isGateway":true,
		"logFile":%q,"logLevel":"debug","ipam":{"type":"village-ipam","dataDir":%q,"ranges":[[{"subnet":"10.42.0.0/30"}]]}}`,
		logFile, filepath.Join(n.Dir, "ipam"))
	p := n.NewPod()
	out := n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: p.ID, Netns: p.NS.Path(), IfName: "eth0", Stdin: []byte(stdin)})
	if out.ExitCode != 0 {
		t.Fatalf("ADD failed: %s %s", out.Stdout, out.Stderr)
	}
	assertOneJSON(t, out.Stdout, "ips")

	// A /30 has one address left after the gateway: the second pod's ADD fails.
	q := n.NewPod()
	n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: q.ID, Netns: q.NS.Path(), IfName: "eth0", Stdin: []byte(stdin)})
	r := n.NewPod()
	out = n.Exec(testenv.Call{Bin: "village", Command: "ADD", ContainerID: r.ID, Netns: r.NS.Path(), IfName: "eth0", Stdin: []byte(stdin)})
	e := CNIError(t, out)
	assertOneJSON(t, out.Stdout, "code")

	lines := logLines(t, logFile)
	if findLine(lines, "village", "ADD start", p.ID) == nil {
		t.Errorf("debug level: no ADD start line for %s", p.ID)
	}
	fail := findLine(lines, "village", "ADD failed", r.ID)
	if fail == nil {
		t.Fatalf("no ADD failed line for %s: %v", r.ID, lines)
	}
	if fail["level"] != "ERROR" || fail["code"] != float64(e.Code) || fail["error"] != e.Msg || fail["result"] != "error" {
		t.Errorf("failure line %v, CNI error %+v", fail, e)
	}
	// The IPAM plugin's own failure is logged with the container ID too.
	if findLine(lines, "village-ipam", "ADD failed", r.ID) == nil {
		t.Errorf("no village-ipam ADD failed line for %s", r.ID)
	}

	// DEL of a pod whose netns is gone still logs (and succeeds).
	out = n.Exec(testenv.Call{Bin: "village", Command: "DEL", ContainerID: p.ID, Netns: "", IfName: "eth0", Stdin: []byte(stdin)})
	if out.ExitCode != 0 || len(out.Stdout) != 0 {
		t.Fatalf("DEL: exit %d stdout %q stderr %s", out.ExitCode, out.Stdout, out.Stderr)
	}
	if findLine(logLines(t, logFile), "village", "DEL ok", p.ID) == nil {
		t.Errorf("no DEL ok line for %s", p.ID)
	}
}

func assertOneJSON(t *testing.T, stdout []byte, key string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(stdout)))
	m := map[string]any{}
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("stdout is not JSON: %v: %q", err, stdout)
	}
	if _, ok := m[key]; !ok {
		t.Fatalf("stdout JSON has no %q: %s", key, stdout)
	}
	var extra any
	if err := dec.Decode(&extra); err == nil {
		t.Fatalf("stdout holds more than one JSON document: %q", stdout)
	}
}

func TestLogFileThatCannotBeOpenedDoesNotFailTheVerb(t *testing.T) {
	n := NewNode(t)
	bad := filepath.Join(n.Dir, "missing-dir", "cni.log")
	l := ConfList(t, loggedList(n, "nolog", "10.43.0.0/24", bad, "info"))
	p := n.NewPod()
	n.MustAdd(l, p)
	must(t, n.Del(l, p), "DEL")
	if _, err := os.Stat(bad); err == nil {
		t.Fatalf("%s was created", bad)
	}
	// Stderr carries the note; run one plugin by hand to see it.
	out := n.Exec(testenv.Call{Bin: "loopback", Command: "ADD", ContainerID: p.ID, Netns: p.NS.Path(), IfName: "lo",
		Stdin: []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"nolog","type":"loopback","logFile":%q}`, bad))})
	if out.ExitCode != 0 {
		t.Fatalf("loopback ADD failed: %s %s", out.Stdout, out.Stderr)
	}
	if !strings.Contains(string(out.Stderr), "cannot open logFile") {
		t.Errorf("stderr: %q", out.Stderr)
	}
	assertOneJSON(t, out.Stdout, "cniVersion")
}
