// Package agentsock is the node agent's local socket: how the `village`
// plugin, which links no Kubernetes client, learns what it needs about a
// pod from `villaged run` (which watches the pods bound to its node), and
// tells it what happened so the agent can show it in the API.
//
// It is the one socket between the plugin and the agent: the LAN pods'
// questions and, as payloads of op "dhcp", the operations of the agent's
// DHCP lease manager (pkg/landhcp) for a LAN whose addresses come from the
// LAN's own DHCP server.
//
// # Protocol (version 2)
//
// A unix stream socket, by default $VILLAGE_RUN_DIR/agent.sock
// (/run/village/agent.sock), mode 0600 and owned by root: only root on the
// node can open it, and the server also refuses a peer whose SO_PEERCRED
// uid is not 0. One request per connection: the client writes one JSON
// Request followed by a newline, the server answers one JSON Response
// followed by a newline and closes. Unknown fields are ignored both ways,
// so either side may add some; a change of meaning bumps V.
//
//	{"v":1,"op":"lan-pod","network":"village","pod":{"namespace":"ns","name":"db-0","uid":"…"}}
//	→ {"v":1,"ok":true,"lan":{"want":true,"ips":["192.168.50.210"]}}
//	{"v":1,"op":"lan-report","network":"village","pod":{…},"report":{"ifName":"net1","addresses":["192.168.50.210/24"]}}
//	{"v":1,"op":"lan-report","network":"village","pod":{…},"report":{"failure":"taken","message":"…"}}
//	→ {"v":1,"ok":true}
//	{"v":1,"op":"lan-list"}
//	→ {"v":1,"ok":true,"pods":[{"namespace":"ns","name":"db-0","addresses":"net1=192.168.50.210/24"}]}
//	{"v":2,"op":"dhcp","dhcp":{"op":"acquire","network":"village","containerID":"…","ifName":"net1","netns":"/var/run/netns/…","mac":"02:…"}}
//	→ {"v":2,"ok":true,"dhcp":{"lease":{"address":"192.168.50.77/24","server":"192.168.50.1",…}}}
//
// A refused request answers ok false with error (a sentence for the
// runtime's log, never parsed) and code (a Code, what the client decides
// from); retry true, kept for version 1 clients, repeats code "retry".
//
// # Versions
//
// Version 2 added op "dhcp" and code; ops lan-pod, lan-report and lan-list
// mean the same in both, so the agent answers a version 1 request of them
// as before (in version 1), and refuses a version 1 "dhcp" and any other
// version with code "version" and a sentence naming both versions. Version
// 1 had no DHCP: the plugin spoke to pkg/landhcp on dhcp.sock in an
// unversioned JSON; such a request sent here has no "v" and gets the same
// versioned refusal, in an "error" field that old client reads.
package agentsock

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
)

// Version is the protocol version this package speaks.
const Version = 2

// MinVersion is the oldest protocol version the agent still answers (its
// LAN ops only).
const MinVersion = 1

// SocketName is the socket's file name in the run directory.
const SocketName = nodelocal.AgentSocketName

// Ops.
const (
	OpLANPod    = "lan-pod"
	OpLANReport = "lan-report"
	OpLANList   = "lan-list"
	// OpDHCP carries a DHCPRequest to the agent's DHCP lease manager
	// (version 2).
	OpDHCP = "dhcp"
)

// Code is why a request failed, what a client decides from (the error's
// sentence is for people).
type Code string

// Codes.
const (
	// CodeNoAgent: nobody answers on the socket (set by the client, never
	// sent): the agent is not running on this node.
	CodeNoAgent Code = "no-agent"
	// CodeRetry: asking again later may succeed (the agent has not seen
	// the pod yet, or the connection broke).
	CodeRetry Code = "retry"
	// CodeVersion: the request's protocol version or op is not one this
	// agent speaks.
	CodeVersion Code = "version"
	// CodeBadRequest: the request is unreadable or lacks a field its op
	// needs.
	CodeBadRequest Code = "bad-request"
	// CodeRefused: the agent read the request and refuses it (its error
	// says why).
	CodeRefused Code = "refused"
)

// Failure reasons of a LAN report, each one an Event reason on the Pod.
const (
	FailOutsidePool = "outside-pool"
	FailTaken       = "taken"
	FailExhausted   = "exhausted"
	FailOther       = "failed"
)

// MaxMessage bounds a request or response line (a DHCP GC list of many
// attachments fits).
const MaxMessage = 4 << 20

// Pod names a Kubernetes pod.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// LAN is the agent's answer about a pod's LAN interface.
type LAN struct {
	// Want: the pod asked for the LAN interface.
	Want bool `json:"want"`
	// IPs are the exact addresses it asked for (village.cni.io/lan-ip).
	IPs []string `json:"ips,omitempty"`
}

// Report is what an ADD did with a pod's LAN interface: its addresses, or
// why it failed (Failure one of the Fail* reasons).
type Report struct {
	IfName    string   `json:"ifName,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
	Failure   string   `json:"failure,omitempty"`
	Message   string   `json:"message,omitempty"`
}

// LANPod is one pod of `lan-list`: a pod of this node with a LAN address.
type LANPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Addresses string `json:"addresses"`
}

// Request is one request line.
type Request struct {
	V       int     `json:"v"`
	Op      string  `json:"op"`
	Network string  `json:"network,omitempty"`
	Pod     *Pod    `json:"pod,omitempty"`
	Report  *Report `json:"report,omitempty"`
	// DHCP is the payload of OpDHCP.
	DHCP *DHCPRequest `json:"dhcp,omitempty"`
}

// Response is one response line.
type Response struct {
	V     int      `json:"v"`
	OK    bool     `json:"ok"`
	Error string   `json:"error,omitempty"`
	Code  Code     `json:"code,omitempty"`
	Retry bool     `json:"retry,omitempty"`
	LAN   *LAN     `json:"lan,omitempty"`
	Pods  []LANPod `json:"pods,omitempty"`
	// DHCP is the answer to OpDHCP.
	DHCP *DHCPResponse `json:"dhcp,omitempty"`
}

// Path is the socket in runDir ("" = the run directory), nodelocal.AgentSocket.
func Path(runDir string) string { return nodelocal.AgentSocket(runDir) }

// Error is a refusal by the agent (or no agent at all).
type Error struct {
	Socket string
	Code   Code
	Msg    string
	// Retry: asking again later may succeed (Code CodeRetry or
	// CodeNoAgent).
	Retry bool
}

func (e *Error) Error() string { return e.Msg }

// Ask sends req to the agent at path and returns its answer; a refusal is
// an *Error carrying the agent's sentence, and so is an agent that cannot
// be reached (naming the socket).
func Ask(ctx context.Context, path string, req Request) (*Response, error) {
	req.V = Version
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, &Error{Socket: path, Code: CodeNoAgent, Retry: true, Msg: fmt.Sprintf(
			"village's node agent (villaged run) does not answer on %s: %v; is the village DaemonSet's agent running on this node?", path, err)}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	// An agent that closes the connection unanswered (it refuses the
	// peer, or it stops) shows as a failed write or a failed read,
	// whichever the scheduler lets come first: one error for both.
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, &Error{Socket: path, Code: CodeRetry, Retry: true, Msg: fmt.Sprintf("village's node agent on %s: no answer to %s (sending it: %v)", path, req.Op, err)}
	}
	var resp Response
	if err := readLine(bufio.NewReaderSize(conn, 4096), &resp); err != nil {
		return nil, &Error{Socket: path, Code: CodeRetry, Retry: true, Msg: fmt.Sprintf("village's node agent on %s: no answer to %s: %v", path, req.Op, err)}
	}
	if !resp.OK {
		code := resp.Code
		if code == "" { // an agent of version 1
			code = CodeRefused
			if resp.Retry {
				code = CodeRetry
			}
		}
		return &resp, &Error{Socket: path, Code: code, Retry: code == CodeRetry, Msg: fmt.Sprintf("village's node agent: %s", resp.Error)}
	}
	return &resp, nil
}

// ErrorCode is err's Code when it is an *Error, "" otherwise.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// DecodeRequest reads one request line from r (bounded by MaxMessage).
func DecodeRequest(r *bufio.Reader) (Request, error) {
	var req Request
	err := readLine(r, &req)
	return req, err
}

// DecodeResponse reads one response line from r (bounded by MaxMessage).
func DecodeResponse(r *bufio.Reader) (Response, error) {
	var resp Response
	err := readLine(r, &resp)
	return resp, err
}

func readLine(r *bufio.Reader, v any) error {
	var line []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return err
		}
		line = append(line, chunk...)
		if len(line) > MaxMessage {
			return fmt.Errorf("message longer than %d bytes", MaxMessage)
		}
		if !isPrefix {
			break
		}
	}
	return json.Unmarshal(line, v)
}

// Handler answers the requests; its methods may be called concurrently.
// An error a handler returns is the refusal's sentence; wrap ErrRetry in it
// when asking again later may succeed.
type Handler interface {
	LANPod(ctx context.Context, network string, pod Pod) (LAN, error)
	LANReport(ctx context.Context, network string, pod Pod, r Report) error
	LANList(ctx context.Context) ([]LANPod, error)
	// DHCP answers a request of the DHCP lease manager (op "dhcp").
	DHCP(ctx context.Context, req DHCPRequest) (DHCPResponse, error)
}

// ErrRetry marks a refusal that may succeed later.
var ErrRetry = errors.New("try again")

// RequestTimeout bounds the handling of one LAN request on the server.
const RequestTimeout = 30 * time.Second

// DHCPTimeout bounds the handling of one DHCP request on the server (an
// acquire's DISCOVER..ACK, with its retransmissions, is the longest).
const DHCPTimeout = 2 * time.Minute

// Listen makes a root-only socket at path (replacing a stale one), 0600 in
// a 0700 directory it creates when missing.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: removing the old one: %w", path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	// Between bind and chmod the socket has the umask's mode; the
	// directory (0700 when made here) and the peer check cover that.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// Serve answers on l until ctx is done, then closes l and removes its
// file once every request in flight is answered.
func Serve(ctx context.Context, l *net.UnixListener, h Handler, logf func(string, ...any)) {
	l.SetUnlinkOnClose(true)
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		l.Close()
	}()
	defer close(done)
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil {
				logf("agent socket: %v", err)
			}
			return
		}
		go serveConn(ctx, conn, h, logf)
	}
}

func serveConn(ctx context.Context, conn *net.UnixConn, h Handler, logf func(string, ...any)) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(DHCPTimeout + 5*time.Second))
	// The one peer check of the agent's socket: a request may name a
	// network namespace the agent enters.
	if uid, err := PeerUID(conn); err != nil || uid != 0 {
		logf("agent socket: refusing a peer (uid %d, %v): only root may ask", uid, err)
		return
	}
	var resp Response
	req, err := DecodeRequest(bufio.NewReaderSize(conn, 4096))
	if err != nil {
		resp = Response{Error: fmt.Sprintf("unreadable request: %v", err), Code: CodeBadRequest}
	} else {
		timeout := RequestTimeout
		if req.Op == OpDHCP {
			timeout = DHCPTimeout
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		resp = handle(rctx, h, req)
		cancel()
	}
	resp.V = answerVersion(req.V)
	b, _ := json.Marshal(resp)
	_, _ = conn.Write(append(b, '\n'))
}

// answerVersion is the version of the answer to a request of version v:
// v when the agent speaks it, else its own.
func answerVersion(v int) int {
	if v >= MinVersion && v <= Version {
		return v
	}
	return Version
}

// handle answers req; a refusal's Code comes from where it failed.
func handle(ctx context.Context, h Handler, req Request) Response {
	fail := func(err error) Response {
		code := CodeRefused
		if errors.Is(err, ErrRetry) {
			code = CodeRetry
		}
		return Response{Error: err.Error(), Code: code, Retry: code == CodeRetry}
	}
	failCode := func(code Code, format string, a ...any) Response {
		return Response{Error: fmt.Sprintf(format, a...), Code: code}
	}
	if req.V < MinVersion || req.V > Version {
		return failCode(CodeVersion, "protocol version %d; this agent speaks %d to %d on its socket (upgrade the plugin and the agent together: `villaged install` puts the plugin of the agent's version in place)", req.V, MinVersion, Version)
	}
	needPod := func() *Response {
		if req.Pod == nil || req.Pod.Namespace == "" || req.Pod.Name == "" {
			r := failCode(CodeBadRequest, "%s without a pod", req.Op)
			return &r
		}
		return nil
	}
	switch req.Op {
	case OpLANPod:
		if r := needPod(); r != nil {
			return *r
		}
		lan, err := h.LANPod(ctx, req.Network, *req.Pod)
		if err != nil {
			return fail(err)
		}
		return Response{OK: true, LAN: &lan}
	case OpLANReport:
		if r := needPod(); r != nil {
			return *r
		}
		if req.Report == nil {
			return failCode(CodeBadRequest, "lan-report without a report")
		}
		if err := h.LANReport(ctx, req.Network, *req.Pod, *req.Report); err != nil {
			return fail(err)
		}
		return Response{OK: true}
	case OpLANList:
		pods, err := h.LANList(ctx)
		if err != nil {
			return fail(err)
		}
		return Response{OK: true, Pods: pods}
	case OpDHCP:
		if req.V < 2 {
			return failCode(CodeVersion, "op %q needs protocol version 2, the request is version %d (upgrade the plugin and the agent together)", req.Op, req.V)
		}
		if req.DHCP == nil {
			return failCode(CodeBadRequest, "dhcp without a dhcp request")
		}
		d, err := h.DHCP(ctx, *req.DHCP)
		if err != nil {
			return fail(err)
		}
		return Response{OK: true, DHCP: &d}
	default:
		return failCode(CodeVersion, "unknown op %q in protocol version %d", req.Op, req.V)
	}
}
