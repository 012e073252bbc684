// Package etcdtest runs a real, single-member etcd server inside a test
// process (go.etcd.io/etcd/server/v3/embed), on 127.0.0.1 with free ports and
// its data in t.TempDir(). It can stop and start the server again on the same
// ports with the same data (to test "etcd down, then back"), and serve over
// TLS with a CA and certificates it generates, so TLS is tested for real.
// The server logs errors only, to stderr.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/village-cni/village/pkg/etcdclient"
)

// StartTimeout bounds how long Start and Restart wait for the server to serve.
const StartTimeout = 20 * time.Second

// Server is a running (or stopped) embedded etcd.
type Server struct {
	// Endpoints are the client URLs ("http://127.0.0.1:PORT", https with TLS).
	Endpoints []string
	// Dir is the data directory.
	Dir string
	// TLS is set for a server started by StartTLS.
	TLS *Certs

	t         testing.TB
	clientURL url.URL
	peerURL   url.URL
	mu        sync.Mutex
	etcd      *embed.Etcd
	level     zap.AtomicLevel // raised while stopping: shutdown logs errors
	// netns, when set (StartIn), is where the listeners are created.
	netns ns.NetNS
}

// Start starts a plain-HTTP etcd and stops it when the test ends. It fails
// the test when the server does not come up.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

// StartTLS starts an etcd serving https that requires client certificates
// signed by a CA generated for it; the files are in s.TLS.
func StartTLS(t testing.TB) *Server {
	t.Helper()
	return start(t, GenerateCerts(t))
}

func start(t testing.TB, certs *Certs) *Server {
	t.Helper()
	s := &Server{t: t, Dir: t.TempDir(), TLS: certs, level: zap.NewAtomicLevelAt(zap.ErrorLevel)}
	scheme := "http"
	if certs != nil {
		scheme = "https"
	}
	var lastErr error
	for range 5 { // another process may take a port between pick and bind
		cp, pp, err := freePorts()
		if err != nil {
			t.Fatalf("etcdtest: picking free ports: %v", err)
		}
		s.clientURL = url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", cp)}
		s.peerURL = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
		if lastErr = s.run(); lastErr == nil {
			break
		}
		if !strings.Contains(lastErr.Error(), "address already in use") {
			break
		}
		os.RemoveAll(s.Dir)
		os.MkdirAll(s.Dir, 0o700)
	}
	if lastErr != nil {
		t.Fatalf("etcdtest: starting etcd: %v", lastErr)
	}
	s.Endpoints = []string{s.clientURL.String()}
	t.Cleanup(s.Stop)
	return s
}

func freePorts() (int, int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports[0], ports[1], nil
}

func (s *Server) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.Dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true // test data; makes writes fast
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(zapcore.NewCore(
		zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.Lock(os.Stderr), s.level)))
	if s.TLS != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       s.TLS.ServerCertFile,
			KeyFile:        s.TLS.ServerKeyFile,
			TrustedCAFile:  s.TLS.CAFile,
			ClientCertAuth: true,
		}
	}
	return cfg
}

func (s *Server) run() error {
	s.level.SetLevel(zap.ErrorLevel)
	cfg := s.config()
	var e *embed.Etcd
	var err error
	if s.netns == nil {
		e, err = embed.StartEtcd(cfg)
	} else {
		// Sockets belong to the namespace of the thread that creates them;
		// the gRPC gateway would dial from an arbitrary thread, so it is off.
		cfg.EnableGRPCGateway = false
		err = s.netns.Do(func(ns.NetNS) error {
			e, err = embed.StartEtcd(cfg)
			return err
		})
	}
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd failed while starting: %w", err)
	case <-time.After(StartTimeout):
		e.Close()
		return errors.New("etcd did not become ready within " + StartTimeout.String())
	}
	s.mu.Lock()
	s.etcd = e
	s.mu.Unlock()
	return nil
}

// Stop stops the server (keeping its data). Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.etcd
	s.etcd = nil
	s.mu.Unlock()
	if e != nil {
		s.level.SetLevel(zap.FatalLevel)
		e.Close()
	}
}

// Restart stops the server if it runs, then starts it again on the same
// ports with the same data. It fails the test if it cannot.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	for range 50 { // the old listeners may take a moment to go away
		if err = s.run(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("etcdtest: restarting etcd on %s: %v", s.clientURL.String(), err)
}

// ClientConfig is an etcdclient.Config reaching the server (with the client
// certificate and CA for a TLS server).
func (s *Server) ClientConfig() etcdclient.Config {
	c := etcdclient.Config{Endpoints: s.Endpoints, DialTimeout: 5 * time.Second}
	if s.TLS != nil {
		c.CAFile, c.CertFile, c.KeyFile = s.TLS.CAFile, s.TLS.ClientCertFile, s.TLS.ClientKeyFile
	}
	return c
}
