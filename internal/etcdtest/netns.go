package etcdtest

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// StartIn starts a plain-HTTP etcd whose listening sockets live in the
// network namespace n (one the test made), on ip:2379 (clients) and
// ip:2380 (peers), ip being an address of n. Nodes in other namespaces
// reach it over whatever links the test made to n; nothing listens in the
// test's own namespace. It stops when the test ends.
//
// A socket belongs to the namespace of the thread that creates it, and
// embed.StartEtcd creates its listeners before it returns, so it is called
// on a thread switched into n (ns.Do locks it); the serving goroutines run
// anywhere, on sockets that stay in n. The gRPC gateway, which would dial
// the client URL from an arbitrary thread (the wrong namespace), is off:
// clients use gRPC. Restart starts it again in n.
func StartIn(t testing.TB, n ns.NetNS, ip string) *Server {
	t.Helper()
	return startIn(t, n, ip, false)
}

// StartTLSIn is StartIn serving https on ip:2379 with client certificates
// required, like StartTLS; the server certificate names ip, the files are
// in s.TLS.
func StartTLSIn(t testing.TB, n ns.NetNS, ip string) *Server {
	t.Helper()
	return startIn(t, n, ip, true)
}

func startIn(t testing.TB, n ns.NetNS, ip string, withTLS bool) *Server {
	t.Helper()
	addr := net.ParseIP(ip)
	if addr == nil {
		t.Fatalf("etcdtest: %q is not an IP address", ip)
	}
	s := &Server{t: t, Dir: t.TempDir(), level: zap.NewAtomicLevelAt(zap.ErrorLevel)}
	scheme := "http"
	if withTLS {
		s.TLS, scheme = GenerateCerts(t, addr), "https"
	}
	s.clientURL = url.URL{Scheme: scheme, Host: net.JoinHostPort(ip, "2379")}
	s.peerURL = url.URL{Scheme: "http", Host: net.JoinHostPort(ip, "2380")}
	s.netns = n
	if err := s.run(); err != nil {
		t.Fatalf("etcdtest: starting etcd on %s in %s: %v", s.clientURL.String(), n.Path(), err)
	}
	s.Endpoints = []string{s.clientURL.String()}
	t.Cleanup(s.Stop)
	return s
}

// ClientIn returns a client of s whose connections are made from inside n
// (each TCP socket is created on a thread switched into n), so a test can
// read and write a server that StartIn put in a namespace without any
// traffic leaving from its own namespace. It is closed when the test ends.
func (s *Server) ClientIn(t testing.TB, n ns.NetNS) *clientv3.Client {
	t.Helper()
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}
	cfg := clientv3.Config{
		Endpoints:   s.Endpoints,
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(dial)},
		Logger:      zap.NewNop(),
	}
	if s.TLS != nil { // StartTLSIn: the client certificate and the CA
		info := transport.TLSInfo{CertFile: s.TLS.ClientCertFile, KeyFile: s.TLS.ClientKeyFile, TrustedCAFile: s.TLS.CAFile}
		tc, err := info.ClientConfig()
		if err != nil {
			t.Fatalf("etcdtest: TLS client config of %v: %v", s.Endpoints, err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcdtest: client of %v from %s: %v", s.Endpoints, n.Path(), err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
