package cnilog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

func lines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	s := bufio.NewScanner(f)
	for s.Scan() {
		m := map[string]any{}
		if err := json.Unmarshal(s.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %q", err, s.Text())
		}
		out = append(out, m)
	}
	return out
}

func conf(logFile, level string) []byte {
	m := map[string]any{"cniVersion": "1.1.0", "name": "net1", "type": "village"}
	if logFile != "" {
		m["logFile"] = logFile
	}
	if level != "" {
		m["logLevel"] = level
	}
	b, _ := json.Marshal(m)
	return b
}

func TestNoLogFileNoWork(t *testing.T) {
	called := 0
	f := Wrap("village", skel.CNIFuncs{Add: func(*skel.CmdArgs) error { called++; return nil }})
	if err := f.Add(&skel.CmdArgs{StdinData: conf("", "")}); err != nil || called != 1 {
		t.Fatalf("err %v called %d", err, called)
	}
	if f.Del != nil {
		t.Fatal("a missing verb must stay nil so skel reports it")
	}
}

func TestLinesPerVerbAndLevels(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "cni.log")
	boom := types.NewError(types.ErrTryAgainLater, "range 10.0.0.0/30 is full", "free an address")
	funcs := Wrap("village", skel.CNIFuncs{
		Add: func(*skel.CmdArgs) error {
			_, err := os.Stdout.WriteString(`{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24"}]}`)
			return err
		},
		Del:   func(*skel.CmdArgs) error { return boom },
		Check: func(*skel.CmdArgs) error { return errors.New("plain failure") },
	})
	args := &skel.CmdArgs{ContainerID: "c0ffee", IfName: "eth0", Netns: "/run/netns/x", StdinData: conf(log, "")}
	if err := funcs.Add(args); err != nil {
		t.Fatal(err)
	}
	if err := funcs.Del(args); err != boom {
		t.Fatalf("DEL error changed: %v", err)
	}
	_ = funcs.Check(args)
	got := lines(t, log)
	if len(got) != 3 {
		t.Fatalf("want 3 lines, got %d: %v", len(got), got)
	}
	add, del, check := got[0], got[1], got[2]
	if add["msg"] != "ADD ok" || add["containerID"] != "c0ffee" || add["network"] != "net1" || add["plugin"] != "village" || add["ifname"] != "eth0" {
		t.Errorf("ADD line: %v", add)
	}
	if ips, _ := add["ips"].([]any); len(ips) != 1 || ips[0] != "10.0.0.2/24" {
		t.Errorf("ADD line ips: %v", add["ips"])
	}
	if _, ok := add["duration_ms"].(float64); !ok {
		t.Errorf("ADD line has no duration: %v", add)
	}
	if del["level"] != "ERROR" || del["containerID"] != "c0ffee" || del["code"] != float64(types.ErrTryAgainLater) || !strings.Contains(del["error"].(string), "is full") {
		t.Errorf("DEL line: %v", del)
	}
	if check["code"] != float64(types.ErrInternal) || check["error"] != "plain failure" {
		t.Errorf("CHECK line: %v", check)
	}
	if fi, err := os.Stat(log); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("log mode: %v %v", fi.Mode(), err)
	}

	// error level: successes are dropped, failures kept.
	log2 := filepath.Join(dir, "err.log")
	args.StdinData = conf(log2, "error")
	_ = funcs.Add(args)
	_ = funcs.Del(args)
	if got := lines(t, log2); len(got) != 1 || got[0]["msg"] != "DEL failed" {
		t.Errorf("error level lines: %v", got)
	}
	// debug level: a start line before each verb.
	log3 := filepath.Join(dir, "debug.log")
	args.StdinData = conf(log3, "debug")
	_ = funcs.Add(args)
	if got := lines(t, log3); len(got) != 2 || got[0]["msg"] != "ADD start" || got[0]["cniVersion"] != "1.1.0" {
		t.Errorf("debug lines: %v", got)
	}
}

func TestUnopenableLogDoesNotFail(t *testing.T) {
	var note bytes.Buffer
	stderr = &note
	t.Cleanup(func() { stderr = os.Stderr })
	funcs := Wrap("village-ipam", skel.CNIFuncs{Add: func(*skel.CmdArgs) error { return nil }})
	bad := filepath.Join(t.TempDir(), "no", "such", "dir", "cni.log")
	if err := funcs.Add(&skel.CmdArgs{ContainerID: "x", StdinData: conf(bad, "")}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(note.String(), "cannot open logFile") || !strings.Contains(note.String(), bad) {
		t.Errorf("stderr note: %q", note.String())
	}
	note.Reset()
	if err := funcs.Add(&skel.CmdArgs{StdinData: conf("relative.log", "")}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(note.String(), "not an absolute path") {
		t.Errorf("stderr note: %q", note.String())
	}
}

func TestIPAMSectionFallback(t *testing.T) {
	log := filepath.Join(t.TempDir(), "ipam.log")
	stdin, _ := json.Marshal(map[string]any{"name": "n", "cniVersion": "0.4.0", "ipam": map[string]any{"type": "village-ipam", "logFile": log}})
	funcs := Wrap("village-ipam", skel.CNIFuncs{Del: func(*skel.CmdArgs) error { return nil }})
	if err := funcs.Del(&skel.CmdArgs{ContainerID: "abc", StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	if got := lines(t, log); len(got) != 1 || got[0]["plugin"] != "village-ipam" {
		t.Errorf("lines: %v", got)
	}
}

// TestLevelSpellings logs at each spelling of a level the config parsers
// accept (pkg/validate's set): warn and warning keep failures and drop
// successes; an unknown level logs at info and says so on stderr.
func TestLevelSpellings(t *testing.T) {
	dir := t.TempDir()
	funcs := Wrap("village", skel.CNIFuncs{
		Add: func(*skel.CmdArgs) error { return nil },
		Del: func(*skel.CmdArgs) error { return errors.New("boom") },
	})
	for i, level := range []string{"warn", "warning", "WARNING", "Error"} {
		log := filepath.Join(dir, fmt.Sprintf("%d.log", i))
		args := &skel.CmdArgs{ContainerID: "c0ffee", StdinData: conf(log, level)}
		_ = funcs.Add(args)
		_ = funcs.Del(args)
		if got := lines(t, log); len(got) != 1 || got[0]["msg"] != "DEL failed" {
			t.Errorf("logLevel %q: lines %v, want only the DEL failure", level, got)
		}
	}
	var note bytes.Buffer
	stderr = &note
	t.Cleanup(func() { stderr = os.Stderr })
	log := filepath.Join(dir, "loud.log")
	_ = funcs.Add(&skel.CmdArgs{ContainerID: "c0ffee", StdinData: conf(log, "loud")})
	if got := lines(t, log); len(got) != 1 || got[0]["msg"] != "ADD ok" {
		t.Errorf("logLevel loud: lines %v, want the ADD at info", got)
	}
	if !strings.Contains(note.String(), `logLevel "loud"`) {
		t.Errorf("stderr %q does not name the bad level", note.String())
	}
}

// TestSteps: the steps a verb reports are in its line, in the order they
// ran, a repeated name added up; a failed verb has them too; Step outside a
// logged verb records nothing for the next one.
func TestSteps(t *testing.T) {
	log := filepath.Join(t.TempDir(), "steps.log")
	Step("before", time.Now().Add(-time.Second)) // not inside a logged verb
	funcs := Wrap("village", skel.CNIFuncs{
		Add: func(*skel.CmdArgs) error {
			Step("fork", time.Now().Add(-2*time.Millisecond))
			Step("ipam", time.Now().Add(-3*time.Millisecond))
			Step("fork", time.Now().Add(-2*time.Millisecond))
			return nil
		},
		Del: func(*skel.CmdArgs) error {
			Step("release", time.Now().Add(-time.Millisecond))
			return errors.New("boom")
		},
		Check: func(*skel.CmdArgs) error { return nil },
	})
	args := &skel.CmdArgs{ContainerID: "c0ffee", StdinData: conf(log, "")}
	_ = funcs.Add(args)
	_ = funcs.Del(args)
	_ = funcs.Check(args)
	raw, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if i, j := bytes.Index(raw, []byte(`"fork"`)), bytes.Index(raw, []byte(`"ipam"`)); i < 0 || j < i {
		t.Errorf("steps not in the order they ran: %s", raw)
	}
	got := lines(t, log)
	if len(got) != 3 {
		t.Fatalf("want 3 lines, got %v", got)
	}
	add, _ := got[0]["steps_ms"].(map[string]any)
	if len(add) != 2 || add["fork"].(float64) < 4 || add["ipam"].(float64) < 3 {
		t.Errorf("ADD steps: %v", got[0])
	}
	if del, _ := got[1]["steps_ms"].(map[string]any); len(del) != 1 || del["release"] == nil || got[1]["level"] != "ERROR" {
		t.Errorf("DEL steps: %v", got[1])
	}
	if _, ok := got[2]["steps_ms"]; ok {
		t.Errorf("a verb without steps has steps_ms: %v", got[2])
	}
	Step("after", time.Now())
	if steps.on.Load() || len(steps.list) != 0 && steps.list[0].name == "after" {
		t.Error("Step outside a logged verb recorded")
	}
}
