// Package kubetest runs a real kube-apiserver for tests: Debian's etcd and
// the kube-apiserver binary scripts/kube.sh builds and caches,
// both listening on one address (127.0.0.1 with free ports, or an address
// of a network namespace the test made), with a self-made service-account
// key, static bearer tokens (an admin in system:masters and the identity
// of Village's DaemonSet service account) and RBAC. It returns kubeconfig
// files for both identities and a clientset for the test; everything stops
// and is removed when the test ends, also when starting fails.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/village-cni/village/internal/testenv"
)

// Version is the kube-apiserver release the tests run.
const Version = "v1.37.2"

// ServiceAccount is the user the agent token authenticates as: the
// DaemonSet's service account in deploy/kubernetes, so a test that applies
// those RBAC manifests proves they grant enough.
const ServiceAccount = "system:serviceaccount:kube-system:village"

// Binary is the cached kube-apiserver ($VILLAGE_KUBE_APISERVER overrides).
func Binary() (string, error) {
	p := os.Getenv("VILLAGE_KUBE_APISERVER")
	if p == "" {
		p = filepath.Join("/var/cache/village", "kubernetes-"+Version, "kube-apiserver")
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kube-apiserver %s not found at %s (%v): run scripts/kube.sh once (it builds and caches it; scripts/test.sh does)", Version, p, err)
	}
	return p, nil
}

// Options say where the servers listen.
type Options struct {
	// NetNS is the namespace both servers run in (nil: the test's own,
	// on 127.0.0.1 with free ports). Clients in other namespaces reach
	// them over the links the test made to it.
	NetNS ns.NetNS
	// IP is the address of NetNS the API server listens on (ignored
	// without NetNS).
	IP string
	// Audit logs every request's metadata (read with AuditEvents).
	Audit bool
	// Args are extra kube-apiserver flags, given after the defaults (a flag
	// given twice takes the later value), e.g. the endpoint reconciler or
	// the kubelet address types a cluster with nodes needs.
	Args []string
}

// Server is a running etcd + kube-apiserver.
type Server struct {
	// URL is the API server's https://ip:port.
	URL string
	// AdminKubeconfig authenticates in system:masters; AgentKubeconfig
	// as ServiceAccount (which has no rights until the test binds some).
	AdminKubeconfig, AgentKubeconfig string
	// NodeAgentKubeconfig authenticates with the token of the process's
	// $VILLAGE_TEST_CREDENTIAL file (AgentOn): the agent of one node.
	NodeAgentKubeconfig string
	// Config is the admin's client configuration (its connections are
	// made inside NetNS); Client a clientset on it.
	Config *rest.Config
	Client kubernetes.Interface
	// SAKeyFile is the service-account signing key (PEM, PKCS#8) and
	// CAFile the API server's self-signed certificate, which is its own CA:
	// kube-controller-manager signs and publishes with them.
	SAKeyFile, CAFile string

	t        testing.TB
	opts     Options
	dir      string
	ip       string
	port     int
	etcdURL  string
	etcdPeer string
	mu       sync.Mutex
	etcd     *testenv.Proc
	api      *testenv.Proc
}

// Start starts etcd and kube-apiserver and waits until the API server is
// ready. The test fails (never skips) when the binary is missing.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatalf("kubetest: etcd not installed (scripts/deps.sh installs etcd-server): %v", err)
	}
	s := &Server{t: t, opts: opts, dir: t.TempDir()}
	t.Cleanup(s.stopAll)
	if opts.NetNS != nil {
		s.ip, s.port = opts.IP, 6443
		s.etcdURL, s.etcdPeer = "http://127.0.0.1:2379", "http://127.0.0.1:2380"
	} else {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		s.ip, s.port = "127.0.0.1", ports[0]
		s.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		s.etcdPeer = fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	}
	s.URL = "https://" + net.JoinHostPort(s.ip, strconv.Itoa(s.port))
	admin, agent := token(t), token(t)
	if err := s.writeFiles(admin, agent); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	s.etcd = s.spawn("etcd", "etcd", "--name", "kubetest", "--data-dir", filepath.Join(s.dir, "etcd"),
		"--listen-client-urls", s.etcdURL, "--advertise-client-urls", s.etcdURL,
		"--listen-peer-urls", s.etcdPeer, "--initial-advertise-peer-urls", s.etcdPeer,
		"--initial-cluster", "kubetest="+s.etcdPeer, "--log-level", "error")
	s.api = s.spawn("kube-apiserver", bin, s.apiArgs()...)
	s.waitReady()
	if err := s.clients(admin, agent); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return s
}

func (s *Server) apiArgs() []string {
	args := []string{
		"--etcd-servers=" + s.etcdURL,
		"--bind-address=" + s.ip, "--advertise-address=" + s.ip, "--secure-port=" + strconv.Itoa(s.port),
		"--cert-dir=" + filepath.Join(s.dir, "certs"),
		"--token-auth-file=" + filepath.Join(s.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(s.dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(s.dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	}
	if s.opts.Audit {
		args = append(args, "--audit-policy-file="+filepath.Join(s.dir, "audit-policy.yaml"),
			"--audit-log-path="+filepath.Join(s.dir, "audit.log"), "--audit-log-format=json")
	}
	return append(args, s.opts.Args...)
}

func token(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func (s *Server) writeFiles(admin, agent string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	policy := "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"
	if err := os.WriteFile(filepath.Join(s.dir, "audit-policy.yaml"), []byte(policy), 0o600); err != nil {
		return err
	}
	tokens := fmt.Sprintf("%s,kubetest-admin,uid-admin,\"system:masters\"\n%s,%s,uid-village,\"system:serviceaccounts\"\n", admin, agent, ServiceAccount)
	return os.WriteFile(filepath.Join(s.dir, "tokens.csv"), []byte(tokens), 0o600)
}

// spawn starts a server process (inside NetNS when there is one), its
// output going to a log file shown when the test fails.
func (s *Server) spawn(name, bin string, args ...string) *testenv.Proc {
	s.t.Helper()
	argv := append([]string{bin}, args...)
	if s.opts.NetNS != nil {
		argv = append([]string{"ip", "netns", "exec", filepath.Base(s.opts.NetNS.Path())}, argv...)
	}
	p, err := testenv.Spawn(name, filepath.Join(s.dir, name+".log"), true, argv...)
	if err != nil {
		s.t.Fatalf("kubetest: %v", err)
	}
	return p
}

func (s *Server) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t.Failed() {
		for _, name := range []string{"kube-apiserver", "etcd"} {
			if b, err := os.ReadFile(filepath.Join(s.dir, name+".log")); err == nil {
				s.t.Logf("kubetest: %s log (tail):\n%s", name, tail(b, 4000))
			}
		}
	}
	s.api.Stop()
	s.etcd.Stop()
	s.api, s.etcd = nil, nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// dial makes connections from inside NetNS (or here without one).
func (s *Server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.opts.NetNS == nil {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	var c net.Conn
	err := s.opts.NetNS.Do(func(ns.NetNS) error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// waitReady polls /readyz until it answers ok (the API server generates
// its self-signed certificate first, so TLS is not verified here).
func (s *Server) waitReady() {
	s.t.Helper()
	rc := &rest.Config{Host: s.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, Dial: s.dial, Timeout: 5 * time.Second}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		s.t.Fatalf("kubetest: %v", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.api.Done():
			s.t.Fatalf("kubetest: kube-apiserver exited while starting")
		default:
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err == nil && string(body) == "ok" {
			return
		}
		last = fmt.Errorf("%v %s", err, body)
		time.Sleep(200 * time.Millisecond)
	}
	s.t.Fatalf("kubetest: kube-apiserver at %s not ready within 90s: %v", s.URL, last)
}

func (s *Server) clients(admin, agent string) error {
	ca, err := os.ReadFile(filepath.Join(s.dir, "certs", "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("the API server's self-signed certificate: %w", err)
	}
	s.SAKeyFile, s.CAFile = filepath.Join(s.dir, "sa.key"), filepath.Join(s.dir, "certs", "apiserver.crt")
	s.AdminKubeconfig = filepath.Join(s.dir, "admin.kubeconfig")
	s.AgentKubeconfig = filepath.Join(s.dir, "village.kubeconfig")
	for path, tok := range map[string]string{s.AdminKubeconfig: admin, s.AgentKubeconfig: agent} {
		if err := os.WriteFile(path, []byte(kubeconfig(s.URL, ca, tok)), 0o600); err != nil {
			return err
		}
	}
	s.NodeAgentKubeconfig = filepath.Join(s.dir, "node-agent.kubeconfig")
	if err := os.WriteFile(s.NodeAgentKubeconfig, []byte(nodeAgentKubeconfig(s.URL, ca)), 0o600); err != nil {
		return err
	}
	// No client-side rate limit: tests and the benchmark time the server
	// and the agents, not client-go's default 5 requests/s.
	s.Config = &rest.Config{Host: s.URL, BearerToken: admin, TLSClientConfig: rest.TLSClientConfig{CAData: ca}, Dial: s.dial,
		Timeout: 15 * time.Second, QPS: 1000, Burst: 2000}
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	s.Client = cs
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("admin client of %s: %w", s.URL, err)
	}
	return nil
}

func kubeconfig(server string, ca []byte, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: user
  user:
    token: %s
contexts:
- name: kubetest
  context: {cluster: kubetest, user: user}
current-context: kubetest
`, server, b64(ca), token)
}

// RestartAPIServer stops the API server (etcd keeps the data) and starts
// it again on the same address, returning once it is ready.
func (s *Server) RestartAPIServer() {
	s.t.Helper()
	s.StopAPIServer()
	s.StartAPIServer()
}

// APIServerPID is the running kube-apiserver's process id (0: stopped).
func (s *Server) APIServerPID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil {
		return 0
	}
	return s.api.Pid()
}

// StopAPIServer stops the API server only.
func (s *Server) StopAPIServer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.api.Stop()
	s.api = nil
}

// StartAPIServer starts a stopped API server again and waits until ready.
func (s *Server) StartAPIServer() {
	s.t.Helper()
	bin, err := Binary()
	if err != nil {
		s.t.Fatalf("kubetest: %v", err)
	}
	s.mu.Lock()
	s.api = s.spawn("kube-apiserver", bin, s.apiArgs()...)
	s.mu.Unlock()
	s.waitReady()
}

// FreezeAPIServer stops the API server process with SIGSTOP: its sockets
// stay open and nothing answers on them, as with a hung server. It returns
// thaw, which sends SIGCONT (to the process frozen, once; later calls do
// nothing): call it in a t.Cleanup too, so a failing test leaves no frozen
// server behind.
func (s *Server) FreezeAPIServer() (thaw func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil || s.api.Exited() {
		return nil, fmt.Errorf("kubetest: no API server running to freeze")
	}
	// The process itself, not its group: the watchdog shell beside it
	// must keep running.
	pid := s.api.Pid()
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(comm)) != "kube-apiserver" {
		return nil, fmt.Errorf("kubetest: pid %d is %q, not kube-apiserver (%v)", pid, comm, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("kubetest: freezing kube-apiserver (pid %d): %w", pid, err)
	}
	var once sync.Once
	return func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }, nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// AuditEvent is one request as the audit log records it.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	Stage      string `json:"stage"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string    `json:"userAgent"`
	Received  time.Time `json:"requestReceivedTimestamp"`
}

// AuditEvents reads the audit log (Options.Audit): one event per request
// of user (every user when ""), at the stage the request was first logged.
func (s *Server) AuditEvents(user string) ([]AuditEvent, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "audit.log"))
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []AuditEvent
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		var e AuditEvent
		var id struct {
			AuditID string `json:"auditID"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || json.Unmarshal([]byte(line), &id) != nil {
			continue
		}
		if (user != "" && e.User.Username != user) || seen[id.AuditID] {
			continue
		}
		seen[id.AuditID] = true
		out = append(out, e)
	}
	return out, nil
}

// OpenWatches are the watches the API server holds open for clients whose
// user agent starts with agent, by request URI (sorted): the WATCH requests
// of the audit log (Options.Audit) that have started their response and
// not completed it.
func (s *Server) OpenWatches(agent string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "audit.log"))
	if err != nil {
		return nil, err
	}
	open := map[string]string{} // auditID -> request URI
	for _, line := range strings.Split(string(b), "\n") {
		var e struct {
			AuditEvent
			AuditID string `json:"auditID"`
		}
		if line == "" || json.Unmarshal([]byte(line), &e) != nil || e.Verb != "watch" || !strings.HasPrefix(e.UserAgent, agent) {
			continue
		}
		switch e.Stage {
		case "ResponseStarted":
			open[e.AuditID] = e.RequestURI
		case "ResponseComplete", "Panic":
			delete(open, e.AuditID)
		}
	}
	return slices.Sorted(maps.Values(open)), nil
}
