package testenv

import (
	"net"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// ServeTCP listens on addr (for example "[::]:80": both families) inside n
// and answers every connection with answer, then closes it, until the test
// ends.
func ServeTCP(t testing.TB, n ns.NetNS, addr, answer string) {
	t.Helper()
	var ln net.Listener
	if err := InNS(n, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, n.Path(), err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(answer))
			c.Close()
		}
	}()
}
