package etcdclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/village-cni/village/internal/etcdtest"
	"github.com/village-cni/village/pkg/etcdclient"
)

// deadEndpoint is a 127.0.0.1 port nothing listens on.
func deadEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// get runs one Get bounded by timeout and describes its error.
func get(t *testing.T, cfg etcdclient.Config, timeout time.Duration) error {
	t.Helper()
	cli, err := etcdclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = cli.Get(ctx, "k")
	return cfg.Describe(timeout, "reading k", err)
}

func TestPlain(t *testing.T) {
	s := etcdtest.Start(t)
	if err := get(t, s.ClientConfig(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestUnreachableFailsFastNamingEndpoints checks that the Get's own deadline
// fires (DeadlineExceeded, described as "unreachable after 500ms" with the
// probe's "connection refused"). The 60 s bound only guards against a hang.
func TestUnreachableFailsFastNamingEndpoints(t *testing.T) {
	ep := deadEndpoint(t)
	done := make(chan error, 1)
	go func() { done <- get(t, etcdclient.Config{Endpoints: []string{ep}}, 500*time.Millisecond) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Get against an unreachable etcd still running after 60s")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the deadline to fire (context.DeadlineExceeded)", err)
	}
	for _, want := range []string{"etcd at [" + ep + "] unreachable after 500ms", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestTLS(t *testing.T) {
	s := etcdtest.StartTLS(t)
	if err := get(t, s.ClientConfig(), 5*time.Second); err != nil {
		t.Fatalf("TLS with the right CA and client certificate: %v", err)
	}
	t.Run("WrongCA", func(t *testing.T) {
		cfg := s.ClientConfig()
		cfg.CAFile = s.TLS.OtherCAFile
		err := get(t, cfg, time.Second)
		if err == nil || !strings.Contains(err.Error(), "x509") || !strings.Contains(err.Error(), s.Endpoints[0]) {
			t.Fatalf("wrong CA: %v; want an x509 error naming %s", err, s.Endpoints[0])
		}
		t.Log(err)
	})
	t.Run("ClientCertFromOtherCA", func(t *testing.T) {
		cfg := s.ClientConfig()
		cfg.CertFile, cfg.KeyFile = s.TLS.OtherClientCertFile, s.TLS.OtherClientKeyFile
		err := get(t, cfg, time.Second)
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("client certificate from another CA: %v; want a certificate error", err)
		}
		t.Log(err)
	})
	t.Run("NoClientCert", func(t *testing.T) {
		cfg := s.ClientConfig()
		cfg.CertFile, cfg.KeyFile = "", ""
		if err := get(t, cfg, time.Second); err == nil {
			t.Fatal("a server requiring client certificates accepted none")
		} else {
			t.Log(err)
		}
	})
}

func TestTLSFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := etcdtest.GenerateCerts(t)
	ep := []string{"https://127.0.0.1:2379"}
	for name, cfg := range map[string]etcdclient.Config{
		missing:              {Endpoints: ep, CAFile: missing},
		garbage:              {Endpoints: ep, CAFile: garbage},
		missing + " ":        {Endpoints: ep, CertFile: missing, KeyFile: certs.ClientKeyFile},
		certs.ClientCertFile: {Endpoints: ep, CertFile: certs.ClientCertFile},
		certs.CAFile:         {Endpoints: ep, CertFile: certs.ClientCertFile, KeyFile: certs.CAFile},
	} {
		_, err := etcdclient.New(cfg)
		if err == nil || !strings.Contains(err.Error(), strings.TrimSpace(name)) {
			t.Errorf("New(%+v) = %v; want an error naming %s", cfg, err, name)
		}
	}
	if _, err := etcdclient.New(etcdclient.Config{}); err == nil {
		t.Error("New with no endpoints succeeded")
	}
}

// TestNothingOnStdout runs failing calls with os.Stdout replaced by a pipe:
// nothing may reach it (stdout is the CNI result channel).
func TestNothingOnStdout(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	func() {
		defer func() { os.Stdout = saved }()
		s := etcdtest.StartTLS(t)
		cfg := s.ClientConfig()
		cfg.CAFile = s.TLS.OtherCAFile
		_ = get(t, cfg, 300*time.Millisecond)
		_ = get(t, etcdclient.Config{Endpoints: []string{deadEndpoint(t)}}, 300*time.Millisecond)
		s.Stop()
	}()
	w.Close()
	out, _ := io.ReadAll(r)
	if len(out) != 0 {
		t.Fatalf("wrote to stdout: %q", out)
	}
}
