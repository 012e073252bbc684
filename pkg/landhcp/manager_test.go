package landhcp

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/village-cni/village/pkg/agentsock"
)

// Requests the manager must refuse before it opens anything in a
// namespace: bad names (they become file names), relative namespace
// paths, bad MACs and client identifiers.
func TestAcquireRefusesBadRequests(t *testing.T) {
	m := New(context.Background(), t.TempDir(), nil)
	good := agentsock.DHCPRequest{Op: agentsock.DHCPAcquire, Attachment: agentsock.Attachment{ContainerID: "c1", IfName: "net1"}, Netns: "/run/netns/x", MAC: "02:42:c0:a8:4d:78"}
	for _, tc := range []struct {
		name string
		edit func(*agentsock.DHCPRequest)
		want string
	}{
		{"container ID with a slash", func(r *agentsock.DHCPRequest) { r.ContainerID = "../etc" }, "containerID"},
		{"empty interface", func(r *agentsock.DHCPRequest) { r.IfName = "" }, "ifName"},
		{"interface with a slash", func(r *agentsock.DHCPRequest) { r.IfName = "a/b" }, "ifName"},
		{"relative netns", func(r *agentsock.DHCPRequest) { r.Netns = "netns/x" }, "absolute"},
		{"no MAC", func(r *agentsock.DHCPRequest) { r.MAC = "" }, "mac"},
		{"multicast MAC", func(r *agentsock.DHCPRequest) { r.MAC = "01:00:5e:00:00:fb" }, "mac"},
		{"client ID not hex", func(r *agentsock.DHCPRequest) { r.ClientID = "zz" }, "clientID"},
		{"client ID of one byte", func(r *agentsock.DHCPRequest) { r.ClientID = "01" }, "clientID"},
	} {
		req := good
		tc.edit(&req)
		resp, err := m.Handle(context.Background(), req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: answer %+v %v, want an error naming %q", tc.name, resp, err, tc.want)
		}
	}
	// A namespace the agent cannot see (a containerised villaged without
	// the host's netns directory): the answer says what to mount.
	req := good
	req.Netns = filepath.Join(t.TempDir(), "netns", "cni-x")
	_, err := m.Handle(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "not visible to villaged") || !strings.Contains(err.Error(), "HostToContainer") {
		t.Errorf("netns not visible: answer %v, want an error naming the missing mount", err)
	}
	if _, err := m.Handle(context.Background(), agentsock.DHCPRequest{Op: "renew"}); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Errorf("unknown op: %v", err)
	}
	if _, err := m.Handle(context.Background(), agentsock.DHCPRequest{Op: agentsock.DHCPStatus}); err != nil {
		t.Errorf("status: %v", err)
	}
}

// The default client identifier is type 1 and the MAC, so the server
// knows the pod by its MAC wherever it runs; the host name is cut to a
// DNS label's length.
func TestIdentityDefaults(t *testing.T) {
	m := New(context.Background(), t.TempDir(), nil)
	id, err := m.identityOf(agentsock.DHCPRequest{Attachment: agentsock.Attachment{ContainerID: "c1", IfName: "net1"}, Netns: "/run/netns/x",
		MAC: "02:42:c0:a8:4d:78", Hostname: strings.Repeat("a", 80)})
	if err != nil {
		t.Fatal(err)
	}
	if got := id.ClientID; len(got) != 7 || got[0] != 1 || got[1] != 0x02 || got[6] != 0x78 {
		t.Errorf("client ID %x, want 01 and the MAC", got)
	}
	if len(id.Hostname) != 63 {
		t.Errorf("host name of %d bytes, want 63", len(id.Hostname))
	}
}

// Release and GC of what is not held succeed; Check says nothing is held.
func TestNothingHeld(t *testing.T) {
	m := New(context.Background(), t.TempDir(), nil)
	a := agentsock.Attachment{ContainerID: "c1", IfName: "net1"}
	if err := m.Release(a); err != nil {
		t.Errorf("release: %v", err)
	}
	if n, err := m.GC("net", nil); n != 0 || err != nil {
		t.Errorf("GC: %d %v", n, err)
	}
	if _, err := m.Check(a); err == nil || !strings.Contains(err.Error(), "no lease") {
		t.Errorf("check: %v", err)
	}
}

// Resume drops the record of a pod whose namespace is gone (its lease
// lapses) and leaves an unreadable file alone for the admin.
func TestResumeDropsGonePods(t *testing.T) {
	dir := t.TempDir()
	a := agentsock.Attachment{ContainerID: "c1", IfName: "net1"}
	l := ack(t)
	r := &record{Attachment: a, Network: "n", Netns: filepath.Join(dir, "no-such-netns"), MAC: "02:42:c0:a8:4d:78",
		ClientID: []byte{1, 2, 0x42, 0xc0, 0xa8, 0x4d, 0x78}, Offer: l.ToBytes(), ACK: l.ToBytes()}
	if err := save(dir, r); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "broken_net1.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs []string
	m := New(context.Background(), dir, func(f string, args ...any) { logs = append(logs, f) })
	if n := m.Resume(); n != 0 {
		t.Fatalf("resumed %d leases of gone pods", n)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName(a))); !os.IsNotExist(err) {
		t.Errorf("record of a gone pod still there: %v", err)
	}
	if _, err := os.Stat(bad); err != nil {
		t.Errorf("unreadable record removed: %v", err)
	}
	if len(logs) != 2 {
		t.Errorf("logs %q, want one for the broken file and one for the gone pod", logs)
	}
}

// FuzzReadRequest: any bytes on the socket give a request or an error,
// and a decoded request is answered (refused or not) without a panic.
func FuzzReadRequest(f *testing.F) {
	for _, s := range []string{
		`{"op":"acquire","containerID":"c","ifName":"net1","netns":"/run/netns/x","mac":"02:42:c0:a8:4d:78"}`,
		`{"op":"gc","network":"n","valid":[{"containerID":"c","ifName":"net1"}]}`,
		`{"op":"release","containerID":"../../x","ifName":"net1"}`,
		`{"op":"check"}`, `{}`, `[]`, `{"op":"acquire","mac":"zz","clientID":"0"}`,
	} {
		f.Add([]byte(s))
	}
	m := New(context.Background(), f.TempDir(), nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req agentsock.DHCPRequest
		if err := json.Unmarshal(b, &req); err != nil {
			return
		}
		if req.Op == agentsock.DHCPAcquire {
			if _, err := m.identityOf(req); err == nil && !filepath.IsAbs(req.Netns) {
				t.Fatalf("accepted relative netns %q", req.Netns)
			}
			return // a valid one would open the namespace it names
		}
		resp, _ := m.Handle(context.Background(), req)
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
	})
}
