package main

import (
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/internal/testenv"
)

func TestSockaddr(t *testing.T) {
	for _, c := range []struct {
		in     string
		family int
		ok     bool
	}{
		{"10.1.0.2:5300", unix.AF_INET, true},
		{"[fd00::2]:5300", unix.AF_INET6, true},
		{"10.1.0.2", 0, false},
		{"host:5300", 0, false},
		{"", 0, false},
	} {
		_, family, err := sockaddr(c.in)
		if (err == nil) != c.ok || family != c.family {
			t.Errorf("sockaddr(%q) = family %d, err %v; want family %d, ok %v", c.in, family, err, c.family, c.ok)
		}
	}
}

// TestRoundTrip runs the server and the client over the loopback of a
// namespace the test makes, IPv4 and IPv6, and checks the client counted
// transactions that really crossed: the server answers only what it read,
// so every one counted is a request and an answer.
func TestRoundTrip(t *testing.T) {
	n := testenv.NewNS(t)
	for _, addr := range []string{"127.0.0.1:5300", "[::1]:5301"} {
		var fd int
		if err := n.Do(func(ns.NetNS) error {
			var err error
			fd, err = listen(addr)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- serveOne(fd, 3) }()
		var r Result
		if err := n.Do(func(ns.NetNS) error {
			var err error
			r, err = client(addr, 3, 10*time.Millisecond, 200*time.Millisecond)
			return err
		}); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if err := <-served; err != nil {
			t.Fatalf("%s: server: %v", addr, err)
		}
		unix.Close(fd)
		if r.Transactions == 0 || r.PerSecond <= 0 || r.P50us <= 0 || r.P99us < r.P50us {
			t.Errorf("%s: implausible result %+v", addr, r)
		}
	}
}
