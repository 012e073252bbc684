// Package agentsock is the node agent's local socket: how the `village`
// plugin, which links no Kubernetes client, learns what it needs about a
// pod from `villaged run` (which watches the pods bound to its node), and
// tells it what happened so the agent can show it in the API.
//
// # Protocol (version 1)
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
//
// A refused request answers ok false with error (a sentence for the
// runtime's log) and retry true when asking again later may succeed (the
// agent has not seen the pod yet).
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
const Version = 1

// SocketName is the socket's file name in the run directory.
const SocketName = nodelocal.AgentSocketName

// Ops.
const (
	OpLANPod    = "lan-pod"
	OpLANReport = "lan-report"
	OpLANList   = "lan-list"
)

// Failure reasons of a LAN report, each one an Event reason on the Pod.
const (
	FailOutsidePool = "outside-pool"
	FailTaken       = "taken"
	FailExhausted   = "exhausted"
	FailOther       = "failed"
)

// MaxMessage bounds a request or response line.
const MaxMessage = 1 << 20

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
}

// Response is one response line.
type Response struct {
	V     int      `json:"v"`
	OK    bool     `json:"ok"`
	Error string   `json:"error,omitempty"`
	Retry bool     `json:"retry,omitempty"`
	LAN   *LAN     `json:"lan,omitempty"`
	Pods  []LANPod `json:"pods,omitempty"`
}

// Path is the socket in runDir ("" = the run directory), nodelocal.AgentSocket.
func Path(runDir string) string { return nodelocal.AgentSocket(runDir) }

// Error is a refusal by the agent (or no agent at all).
type Error struct {
	Socket string
	Msg    string
	// Retry: asking again later may succeed.
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
		return nil, &Error{Socket: path, Retry: true, Msg: fmt.Sprintf(
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
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, &Error{Socket: path, Retry: true, Msg: fmt.Sprintf("village's node agent on %s: sending %s: %v", path, req.Op, err)}
	}
	var resp Response
	if err := readLine(conn, &resp); err != nil {
		return nil, &Error{Socket: path, Retry: true, Msg: fmt.Sprintf("village's node agent on %s: no answer to %s: %v", path, req.Op, err)}
	}
	if !resp.OK {
		return &resp, &Error{Socket: path, Retry: resp.Retry, Msg: fmt.Sprintf("village's node agent: %s", resp.Error)}
	}
	return &resp, nil
}

func readLine(conn net.Conn, v any) error {
	r := bufio.NewReaderSize(conn, 4096)
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
}

// ErrRetry marks a refusal that may succeed later.
var ErrRetry = errors.New("try again")

// RequestTimeout bounds the handling of one request on the server.
const RequestTimeout = 30 * time.Second

// Listen makes a root-only socket at path (replacing a stale one), 0600 in
// a 0700 directory it creates when missing: the agent's and pkg/landhcp's.
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
	_ = conn.SetDeadline(time.Now().Add(RequestTimeout + 5*time.Second))
	if uid, err := PeerUID(conn); err != nil || uid != 0 {
		logf("agent socket: refusing a peer (uid %d, %v): only root may ask", uid, err)
		return
	}
	var req Request
	var resp Response
	if err := readLine(conn, &req); err != nil {
		resp.Error = fmt.Sprintf("unreadable request: %v", err)
	} else {
		rctx, cancel := context.WithTimeout(ctx, RequestTimeout)
		resp = handle(rctx, h, req)
		cancel()
	}
	resp.V = Version
	b, _ := json.Marshal(resp)
	_, _ = conn.Write(append(b, '\n'))
}

func handle(ctx context.Context, h Handler, req Request) Response {
	fail := func(err error) Response {
		return Response{Error: err.Error(), Retry: errors.Is(err, ErrRetry)}
	}
	if req.V != Version {
		return fail(fmt.Errorf("protocol version %d; this agent speaks %d (upgrade the plugin and the agent together)", req.V, Version))
	}
	needPod := func() error {
		if req.Pod == nil || req.Pod.Namespace == "" || req.Pod.Name == "" {
			return fmt.Errorf("%s without a pod", req.Op)
		}
		return nil
	}
	switch req.Op {
	case OpLANPod:
		if err := needPod(); err != nil {
			return fail(err)
		}
		lan, err := h.LANPod(ctx, req.Network, *req.Pod)
		if err != nil {
			return fail(err)
		}
		return Response{OK: true, LAN: &lan}
	case OpLANReport:
		if err := needPod(); err != nil {
			return fail(err)
		}
		if req.Report == nil {
			return fail(errors.New("lan-report without a report"))
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
	default:
		return fail(fmt.Errorf("unknown op %q", req.Op))
	}
}
