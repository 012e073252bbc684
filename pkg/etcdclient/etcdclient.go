// Package etcdclient builds the etcd client every Village component that
// talks to etcd shares (village-ipam's etcd store, villaged's node registry and
// subnet leases), so TLS, timeouts and logging are set up one way.
//
// The client suits a CNI plugin: it never writes to stdout (the CNI result
// channel) and logs errors only, to stderr; it starts no background work that
// outlives Close (no endpoint auto-sync, and no keep-alive unless
// Config.KeepAlive asks for it, as the long-lived agent does); the
// connection is made lazily, so every call is bounded by the caller's context
// deadline, and Describe turns a deadline into an error naming the endpoints.
package etcdclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/status"
)

// DefaultDialTimeout bounds connecting (and each operation of callers that
// take no other timeout) when Config.DialTimeout is 0.
const DefaultDialTimeout = 5 * time.Second

func init() {
	// gRPC's own logger: errors only, to stderr, whatever GRPC_GO_LOG_* say,
	// so nothing ever reaches stdout. It must be set before any gRPC use.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

// Config says how to reach etcd.
type Config struct {
	// Endpoints are URLs such as "https://10.0.0.1:2379".
	Endpoints []string
	// CAFile verifies the servers' certificates (the system roots when empty).
	// CertFile and KeyFile, given together, are the client certificate.
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds connecting (DefaultDialTimeout when 0).
	DialTimeout time.Duration
	// Logger receives the client's log; nil logs errors only, to stderr.
	Logger *zap.Logger
	// KeepAlive, when set, pings the server every KeepAlive (also without an
	// open stream) and drops a connection whose ping is not answered within
	// KeepAlive/2. A daemon needs it to notice a connection that died
	// silently (its source address went away when the node's underlay
	// address changed): without pings it hangs until TCP gives up, many
	// minutes, while every call times out. 0 (a plugin that lives for one
	// call) sends none. etcd closes connections that ping more often than
	// every 5 s.
	KeepAlive time.Duration
}

// Timeout is c.DialTimeout or its default.
func (c Config) Timeout() time.Duration {
	if c.DialTimeout > 0 {
		return c.DialTimeout
	}
	return DefaultDialTimeout
}

// New returns a client for cfg. It does not wait for a connection: the first
// call connects, bounded by its context. Close the client when done.
func New(cfg Config) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoints given")
	}
	tlsCfg, err := TLSConfig(cfg)
	if err != nil {
		return nil, err
	}
	lg := cfg.Logger
	if lg == nil {
		lg = zap.New(zapcore.NewCore(
			zapcore.NewConsoleEncoder(zap.NewProductionEncoderConfig()),
			zapcore.Lock(os.Stderr), zap.ErrorLevel))
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          cfg.Timeout(),
		DialKeepAliveTime:    cfg.KeepAlive,
		DialKeepAliveTimeout: cfg.KeepAlive / 2,
		AutoSyncInterval:     0,
		TLS:                  tlsCfg,
		Logger:               lg,
		RejectOldCluster:     false,
		PermitWithoutStream:  cfg.KeepAlive > 0,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd at %v: %w", cfg.Endpoints, err)
	}
	return cli, nil
}

// TLSConfig is the TLS setup cfg asks for: nil when it names no file and no
// endpoint is https (plain connections), otherwise a config trusting CAFile
// (or the system roots) and presenting CertFile/KeyFile when given.
func TLSConfig(cfg Config) (*tls.Config, error) {
	secure := cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != ""
	for _, ep := range cfg.Endpoints {
		if len(ep) >= 8 && (ep[:8] == "https://" || ep[:8] == "unixs://") {
			secure = true
		}
	}
	if !secure {
		return nil, nil
	}
	out := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the etcd CA file %s: %w", cfg.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA file %s holds no PEM certificate", cfg.CAFile)
		}
		out.RootCAs = pool
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, fmt.Errorf("etcd client certificate %q and key %q must be given together", cfg.CertFile, cfg.KeyFile)
	}
	if cfg.CertFile != "" {
		for _, f := range []string{cfg.CertFile, cfg.KeyFile} {
			if _, err := os.Stat(f); err != nil {
				return nil, fmt.Errorf("etcd client certificate or key: %w", err)
			}
		}
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading the etcd client certificate %s with key %s: %w", cfg.CertFile, cfg.KeyFile, err)
		}
		out.Certificates = []tls.Certificate{cert}
	}
	return out, nil
}

// ProbeTimeout bounds the connection probe Describe makes after a deadline.
const ProbeTimeout = time.Second

// Describe wraps err, returned by a call to etcd made with a deadline of
// timeout, so that it names the endpoints and what was being done. When etcd
// did not answer in time (the etcd client then reports only "context deadline
// exceeded"), it probes the endpoints for at most ProbeTimeout and adds why
// each cannot be reached: connection refused, a certificate not signed by the
// CA, a client certificate the server rejects. nil stays nil.
func (c Config) Describe(timeout time.Duration, what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
		defer cancel()
		if perr := c.Probe(ctx); perr != nil {
			err = fmt.Errorf("%w; %w", err, perr)
		}
		return fmt.Errorf("etcd at %v unreachable after %s (%s): %w", c.Endpoints, timeout, what, err)
	}
	if status.Code(err) == codes.Unavailable {
		return fmt.Errorf("etcd at %v unavailable (%s): %w", c.Endpoints, what, err)
	}
	return fmt.Errorf("etcd at %v: %s: %w", c.Endpoints, what, err)
}

// Probe connects to every endpoint at once (TCP, then the TLS handshake for
// https) and returns nil when one of them accepts, otherwise why each failed.
// It checks the transport only, not that etcd answers.
func (c Config) Probe(ctx context.Context) error {
	tlsCfg, err := TLSConfig(c)
	if err != nil {
		return err
	}
	errs := make([]error, len(c.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range c.Endpoints {
		wg.Go(func() {
			if err := probe(ctx, ep, tlsCfg); err != nil {
				errs[i] = fmt.Errorf("%s: %w", ep, err)
			}
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e == nil {
			return nil
		}
	}
	return errors.Join(errs...)
}

func probe(ctx context.Context, ep string, tlsCfg *tls.Config) error {
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" {
		return fmt.Errorf("not a URL with a host: %v", err)
	}
	network, addr := "tcp", u.Host
	if u.Scheme == "unix" || u.Scheme == "unixs" {
		network = "unix"
	} else if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "2379")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if u.Scheme != "https" && u.Scheme != "unixs" {
		return nil
	}
	cfg := tlsCfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return err
	}
	// A server requiring a client certificate rejects a missing or untrusted
	// one after the handshake (TLS 1.3): read once to see the alert.
	_ = tc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return nil
}
