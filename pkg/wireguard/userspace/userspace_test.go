package userspace

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStillClear: the sockets fragmentable cleared pass stillClear; once
// one is closed and a new socket takes its port (and, as the kernel hands
// out the lowest free number, its descriptor), they no longer do, so Up
// clears the new one.
func TestStillClear(t *testing.T) {
	bind := func(port int) *net.UDPConn {
		t.Helper()
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := bind(0)
	port := c.LocalAddr().(*net.UDPAddr).Port
	fds, err := fragmentable(port)
	if err != nil {
		t.Fatal(err)
	}
	if len(fds) != 1 {
		t.Fatalf("fragmentable cleared %d sockets on port %d, want 1", len(fds), port)
	}
	if v, err := unix.GetsockoptInt(fds[0], unix.IPPROTO_IP, unix.IP_MTU_DISCOVER); err != nil || v != unix.IP_PMTUDISC_DONT {
		t.Fatalf("IP_MTU_DISCOVER %d (%v), want IP_PMTUDISC_DONT", v, err)
	}
	if !stillClear(fds, port) {
		t.Fatal("stillClear false for the socket just cleared")
	}
	c.Close()
	if stillClear(fds, port) {
		t.Fatal("stillClear true for a closed socket")
	}
	c2 := bind(port)
	defer c2.Close()
	if stillClear(fds, port) {
		t.Fatal("stillClear true after a new socket took the port")
	}
	fds, err = fragmentable(port)
	if err != nil || len(fds) != 1 || !stillClear(fds, port) {
		t.Fatalf("the new socket was not cleared: %v %v", fds, err)
	}
}
