package agentsock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// book is a Handler over a fixed table: what the protocol carries, not
// what the agent decides (pkg/agent and test/kube test that).
type book struct {
	mu      sync.Mutex
	reports []Report
}

func (b *book) LANPod(_ context.Context, network string, p Pod) (LAN, error) {
	switch p.Name {
	case "db-0":
		return LAN{Want: true, IPs: []string{"192.168.50.210"}}, nil
	case "new":
		return LAN{}, fmt.Errorf("pod %s not seen yet: %w", p, ErrRetry)
	case "no":
		return LAN{}, errors.New("namespace may not ask")
	}
	return LAN{}, nil
}

func (b *book) LANReport(_ context.Context, _ string, _ Pod, r Report) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reports = append(b.reports, r)
	return nil
}

func (b *book) LANList(context.Context) ([]LANPod, error) {
	return []LANPod{{Namespace: "ns", Name: "db-0", Addresses: "net1=192.168.50.210/24"}}, nil
}

func (b *book) DHCP(_ context.Context, req DHCPRequest) (DHCPResponse, error) {
	switch req.Op {
	case DHCPAcquire:
		if req.ContainerID == "busy" {
			return DHCPResponse{}, fmt.Errorf("server busy: %w", ErrRetry)
		}
		return DHCPResponse{Lease: &Lease{Address: "192.168.50.77/24", Server: "192.168.50.1"}}, nil
	case DHCPGC:
		return DHCPResponse{Released: len(req.Valid)}, nil
	}
	return DHCPResponse{}, fmt.Errorf("unknown op %q", req.Op)
}

func serve(t *testing.T, h Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", SocketName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Serve(ctx, l, h, t.Logf) }()
	t.Cleanup(func() { cancel(); <-done })
	return path
}

func TestRoundTrip(t *testing.T) {
	b := &book{}
	path := serve(t, b)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: %v %v, want a 0600 socket", path, fi.Mode(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ask := func(op, name string, r *Report) (*Response, error) {
		return Ask(ctx, path, Request{Op: op, Network: "village", Pod: &Pod{Namespace: "ns", Name: name}, Report: r})
	}
	resp, err := ask(OpLANPod, "db-0", nil)
	if err != nil || resp.LAN == nil || !resp.LAN.Want || len(resp.LAN.IPs) != 1 || resp.LAN.IPs[0] != "192.168.50.210" {
		t.Fatalf("lan-pod db-0: %+v %v", resp, err)
	}
	resp, err = ask(OpLANPod, "web", nil)
	if err != nil || resp.LAN == nil || resp.LAN.Want {
		t.Fatalf("lan-pod web: %+v %v, want no LAN", resp, err)
	}
	var e *Error
	if _, err = ask(OpLANPod, "new", nil); !errors.As(err, &e) || !e.Retry || !strings.Contains(err.Error(), "not seen yet") {
		t.Fatalf("lan-pod new: %v, want a retryable refusal", err)
	}
	if _, err = ask(OpLANPod, "no", nil); !errors.As(err, &e) || e.Retry || !strings.Contains(err.Error(), "may not") {
		t.Fatalf("lan-pod no: %v, want a final refusal", err)
	}
	if _, err = ask(OpLANReport, "db-0", &Report{IfName: "net1", Addresses: []string{"192.168.50.210/24"}}); err != nil {
		t.Fatal(err)
	}
	if _, err = ask(OpLANReport, "db-0", nil); err == nil {
		t.Fatal("a report without a report was accepted")
	}
	if len(b.reports) != 1 || b.reports[0].Addresses[0] != "192.168.50.210/24" {
		t.Fatalf("reports %+v", b.reports)
	}
	resp, err = Ask(ctx, path, Request{Op: OpLANList})
	if err != nil || len(resp.Pods) != 1 || resp.Pods[0].Name != "db-0" {
		t.Fatalf("lan-list: %+v %v", resp, err)
	}
	if _, err = Ask(ctx, path, Request{Op: "nonsense"}); err == nil || !strings.Contains(err.Error(), "unknown op") || ErrorCode(err) != CodeVersion {
		t.Fatalf("unknown op: %v, want code version", err)
	}
	// DHCP payloads.
	dhcp := func(d DHCPRequest) (*Response, error) { return Ask(ctx, path, Request{Op: OpDHCP, DHCP: &d}) }
	resp, err = dhcp(DHCPRequest{Op: DHCPAcquire, Attachment: Attachment{ContainerID: "c1", IfName: "net1"}})
	if err != nil || resp.DHCP == nil || resp.DHCP.Lease == nil || resp.DHCP.Lease.Address != "192.168.50.77/24" {
		t.Fatalf("dhcp acquire: %+v %v", resp, err)
	}
	resp, err = dhcp(DHCPRequest{Op: DHCPGC, Valid: []Attachment{{ContainerID: "a", IfName: "net1"}, {ContainerID: "b", IfName: "net1"}}})
	if err != nil || resp.DHCP == nil || resp.DHCP.Released != 2 {
		t.Fatalf("dhcp gc: %+v %v", resp, err)
	}
	if _, err = dhcp(DHCPRequest{Op: DHCPAcquire, Attachment: Attachment{ContainerID: "busy"}}); ErrorCode(err) != CodeRetry || !errors.As(err, &e) || !e.Retry {
		t.Fatalf("dhcp acquire busy: %v, want code retry", err)
	}
	if _, err = dhcp(DHCPRequest{Op: "renew"}); ErrorCode(err) != CodeRefused || !strings.Contains(err.Error(), "renew") {
		t.Fatalf("dhcp renew: %v, want code refused naming the op", err)
	}
}

// TestCodes: the code of every kind of answer, from the request alone.
func TestCodes(t *testing.T) {
	pod := &Pod{Namespace: "ns", Name: "db-0"}
	for _, tc := range []struct {
		name string
		req  Request
		ok   bool
		code Code
	}{
		{"lan-pod v2", Request{V: 2, Op: OpLANPod, Pod: pod}, true, ""},
		{"lan-pod v1", Request{V: 1, Op: OpLANPod, Pod: pod}, true, ""},
		{"lan-pod not seen yet", Request{V: 2, Op: OpLANPod, Pod: &Pod{Namespace: "ns", Name: "new"}}, false, CodeRetry},
		{"lan-pod refused", Request{V: 2, Op: OpLANPod, Pod: &Pod{Namespace: "ns", Name: "no"}}, false, CodeRefused},
		{"lan-pod without a pod", Request{V: 2, Op: OpLANPod}, false, CodeBadRequest},
		{"lan-report without a report", Request{V: 2, Op: OpLANReport, Pod: pod}, false, CodeBadRequest},
		{"lan-list v1", Request{V: 1, Op: OpLANList}, true, ""},
		{"dhcp", Request{V: 2, Op: OpDHCP, DHCP: &DHCPRequest{Op: DHCPAcquire}}, true, ""},
		{"dhcp in version 1", Request{V: 1, Op: OpDHCP, DHCP: &DHCPRequest{Op: DHCPAcquire}}, false, CodeVersion},
		{"dhcp without a payload", Request{V: 2, Op: OpDHCP}, false, CodeBadRequest},
		{"dhcp refused", Request{V: 2, Op: OpDHCP, DHCP: &DHCPRequest{Op: "renew"}}, false, CodeRefused},
		{"no version (the old dhcp.sock JSON)", Request{Op: "acquire"}, false, CodeVersion},
		{"version 3", Request{V: 3, Op: OpLANList}, false, CodeVersion},
		{"unknown op", Request{V: 2, Op: "lan-frob"}, false, CodeVersion},
	} {
		resp := handle(context.Background(), &book{}, tc.req)
		if resp.OK != tc.ok || resp.Code != tc.code || (!resp.OK && resp.Error == "") || resp.Retry != (tc.code == CodeRetry) {
			t.Errorf("%s: answer %+v, want ok %v code %q", tc.name, resp, tc.ok, tc.code)
		}
		if tc.code == CodeVersion && !strings.Contains(resp.Error, "version") {
			t.Errorf("%s: %q does not name the version", tc.name, resp.Error)
		}
	}
}

// rawLine writes line on the socket at path, as a client of another
// version would, and returns the answer's line.
func rawLine(t *testing.T, path, line string) string {
	t.Helper()
	conn, err := net.DialTimeout("unix", path, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	b, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		t.Fatalf("%s: no answer line: %v", line, err)
	}
	return string(b)
}

// TestOlderClients: a plugin of protocol version 1 (an old binary still on
// the node during an upgrade) gets its LAN answer in version 1, and a
// version error, never a hang, for what version 1 lacks; the old
// unversioned DHCP JSON gets a version error in the "error" field it reads.
func TestOlderClients(t *testing.T) {
	path := serve(t, &book{})
	var v1 struct {
		V     int    `json:"v"`
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		LAN   *LAN   `json:"lan"`
	}
	line := rawLine(t, path, `{"v":1,"op":"lan-pod","network":"village","pod":{"namespace":"ns","name":"db-0"}}`)
	if err := json.Unmarshal([]byte(line), &v1); err != nil || v1.V != 1 || !v1.OK || v1.LAN == nil || !v1.LAN.Want || v1.LAN.IPs[0] != "192.168.50.210" {
		t.Fatalf("v1 lan-pod: %s (%v), want the answer in version 1", line, err)
	}
	line = rawLine(t, path, `{"v":1,"op":"dhcp","dhcp":{"op":"acquire"}}`)
	if err := json.Unmarshal([]byte(line), &v1); err != nil || v1.OK || !strings.Contains(v1.Error, "version 2") {
		t.Fatalf("v1 dhcp: %s (%v), want a version error", line, err)
	}
	var old struct {
		Error string `json:"error"`
		Lease any    `json:"lease"`
	}
	line = rawLine(t, path, `{"op":"acquire","containerID":"c1","ifName":"net1","netns":"/run/netns/x","mac":"02:42:c0:a8:4d:78"}`)
	if err := json.Unmarshal([]byte(line), &old); err != nil || old.Lease != nil || !strings.Contains(old.Error, "protocol version 0") {
		t.Fatalf("unversioned dhcp: %s (%v), want a version error", line, err)
	}
}

func TestNoAgentNamesTheSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	_, err := Ask(context.Background(), path, Request{Op: OpLANList})
	var e *Error
	if !errors.As(err, &e) || !e.Retry || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "villaged") {
		t.Fatalf("no agent: %v, want a retryable error naming %s and villaged", err, path)
	}
}

// TestStaleSocketReplaced: an agent restarting after a crash finds its
// old socket file and replaces it.
func TestStaleSocketReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the stale socket is not there: %v", err)
	}
	l2, err := Listen(path)
	if err != nil {
		t.Fatalf("listening over a stale socket: %v", err)
	}
	l2.Close()
}

// FuzzDecode: any bytes decode to a request and a response or an error,
// never a panic, and what decodes encodes and decodes again to the same.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"v":2,"op":"dhcp","dhcp":{"op":"gc","network":"n","valid":[{"containerID":"c","ifName":"net1"}]}}`,
		`{"v":2,"ok":true,"dhcp":{"lease":{"address":"192.168.50.77/24","server":"192.168.50.1","renew":"2026-01-01T00:00:00Z"}}}`,
		`{"v":1,"ok":false,"error":"x","retry":true}`, `{"v":2,"ok":false,"error":"x","code":"version"}`,
		`{"op":"acquire"}`, "[]\n", "{", "", "{}\n{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, rerr := DecodeRequest(bufio.NewReader(bytes.NewReader(b)))
		resp, perr := DecodeResponse(bufio.NewReader(bytes.NewReader(b)))
		if rerr == nil {
			out, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			again, err := DecodeRequest(bufio.NewReader(bytes.NewReader(append(out, '\n'))))
			if err != nil {
				t.Fatalf("%q: a request re-encoded as %s does not decode: %v", b, out, err)
			}
			if out2, _ := json.Marshal(again); !bytes.Equal(out, out2) {
				t.Fatalf("%q: %s then %s", b, out, out2)
			}
		}
		if perr == nil {
			out, err := json.Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeResponse(bufio.NewReader(bytes.NewReader(append(out, '\n')))); err != nil {
				t.Fatalf("%q: a response re-encoded as %s does not decode: %v", b, out, err)
			}
		}
	})
}

// FuzzHandle: whatever a client writes, the server answers one JSON line
// and never panics; a refusal has a sentence.
func FuzzHandle(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"op":"lan-pod","pod":{"namespace":"ns","name":"db-0"}}`,
		`{"v":1,"op":"lan-report","pod":{"namespace":"ns","name":"db-0"}}`,
		`{"v":2,"op":"lan-list"}`, `{"op":"lan-pod"}`, `[]`, `{`, ``,
		`{"v":2,"op":"dhcp","dhcp":{"op":"acquire","containerID":"busy"}}`, `{"v":1,"op":"dhcp","dhcp":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var req Request
		var resp Response
		if err := json.Unmarshal(line, &req); err != nil {
			return
		}
		resp = handle(context.Background(), &book{}, req)
		if !resp.OK && resp.Error == "" {
			t.Fatalf("%q: refusal without a sentence", line)
		}
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
	})
}

var _ net.Conn = (*net.UnixConn)(nil)
