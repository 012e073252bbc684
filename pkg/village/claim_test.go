package village

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/village-cni/village/pkg/cleanup"
)

// fakeIPAM writes an IPAM plugin (a shell script, exec'd for real) that
// records each verb it was sent on log, after reading its whole input, and
// answers ADD with one address (then exits with exit).
func fakeIPAM(t *testing.T, exit int) (ipamCall, string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := "#!/bin/sh\ncat >/dev/null\necho \"$CNI_COMMAND\" >> " + log + "\n" +
		"[ \"$CNI_COMMAND\" = ADD ] || exit 0\n" +
		"printf '{\"cniVersion\":\"1.1.0\",\"ips\":[{\"address\":\"10.0.0.2/24\"}]}'\n" +
		"exit " + strconv.Itoa(exit) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "fake-ipam"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	args := &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/x", IfName: "eth0", Path: dir}
	return ipamCall{Type: "fake-ipam", Args: args, IfName: "eth0", Conf: []byte(`{"cniVersion":"1.1.0","name":"n"}`)}, log
}

func verbs(t *testing.T, log string) string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// TestClaimRollback: what the cleanup stack does with a claim of a failed
// ADD at each point of its life.
func TestClaimRollback(t *testing.T) {
	for _, c := range []struct {
		name  string
		exit  int
		steps func(c *claim)
		want  string // verbs the plugin saw
	}{
		{"never sent: killed having read nothing", 0, func(c *claim) {}, ""},
		{"sent, not read yet: read, then released", 0, func(c *claim) { c.send() }, "ADD DEL"},
		{"answered and reaped: released", 0, func(c *claim) {
			c.send()
			if err := c.wait(); err != nil {
				t.Fatal(err)
			}
		}, "ADD DEL"},
		{"answered, attachment live: kept", 0, func(c *claim) {
			c.send()
			c.live = true
		}, "ADD"},
		{"answered, then exited non-zero: released", 1, func(c *claim) {
			c.send()
			c.live = false
			if _, err := c.answer(); err != nil {
				t.Fatal(err)
			}
			if err := c.wait(); err == nil {
				t.Fatal("wait: nil error for a plugin that exited 1")
			}
		}, "ADD DEL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			call, log := fakeIPAM(t, c.exit)
			var undo cleanup.Stack
			cl, err := forkClaim(call, &undo)
			if err != nil {
				t.Fatal(err)
			}
			cl.live = false // as checkLive finds for a new attachment
			c.steps(cl)
			if err := undo.Run(); err != nil {
				t.Fatalf("rollback: %v", err)
			}
			if got := verbs(t, log); got != c.want {
				t.Fatalf("the plugin saw %q, want %q", got, c.want)
			}
		})
	}
}

// TestClaimLiveUntilChecked: a claim whose ADD failed before it looked for
// a live attachment releases nothing.
func TestClaimLiveUntilChecked(t *testing.T) {
	call, log := fakeIPAM(t, 0)
	var undo cleanup.Stack
	cl, err := forkClaim(call, &undo)
	if err != nil {
		t.Fatal(err)
	}
	cl.send()
	if err := undo.Run(); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if got := verbs(t, log); got != "ADD" {
		t.Fatalf("the plugin saw %q, want only the ADD", got)
	}
}
