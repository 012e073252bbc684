package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/village-cni/village/pkg/etcdclient"
)

func put(t *testing.T, s *Server, k, v string) {
	t.Helper()
	cli, err := etcdclient.New(s.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, s *Server, k string) (string, error) {
	t.Helper()
	cli, err := etcdclient.New(s.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, k)
	if err != nil {
		return "", err
	}
	if len(r.Kvs) == 0 {
		return "", nil
	}
	return string(r.Kvs[0].Value), nil
}

func TestStopRestartKeepsDataAndPorts(t *testing.T) {
	s := Start(t)
	put(t, s, "k", "v")
	eps := s.Endpoints
	s.Stop()
	if _, err := get(t, s, "k"); err == nil {
		t.Fatal("Get succeeded while etcd is stopped")
	}
	s.Restart()
	if s.Endpoints[0] != eps[0] {
		t.Fatalf("endpoints changed: %v -> %v", eps, s.Endpoints)
	}
	if v, err := get(t, s, "k"); err != nil || v != "v" {
		t.Fatalf("after restart Get = %q, %v", v, err)
	}
}

func TestTLS(t *testing.T) {
	s := StartTLS(t)
	put(t, s, "k", "v")
	if v, err := get(t, s, "k"); err != nil || v != "v" {
		t.Fatalf("Get over TLS = %q, %v", v, err)
	}
}
