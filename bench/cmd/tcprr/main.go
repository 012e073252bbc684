// Command tcprr measures the TCP request/response rate over one
// connection, as netperf's TCP_RR does: the client writes a request of
// -size bytes, reads an answer of the same size, and repeats for -t. Both
// ends use blocking sockets through plain syscalls, so one transaction is
// the kernel's path there and back plus two wake-ups of a blocked thread,
// with no Go netpoller in between. cnibench runs it in namespaces it made
// (Debian has no netperf: it is non-free).
//
//	tcprr -listen 10.1.0.2:5300            # prints "ready" once listening; serves connections until killed
//	tcprr -connect 10.1.0.2:5300 -t 3s     # prints one JSON line
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Result is what the client prints.
type Result struct {
	Transactions int     `json:"transactions"`
	Seconds      float64 `json:"seconds"`
	PerSecond    float64 `json:"per_second"`
	P50us        float64 `json:"p50_us"`
	P99us        float64 `json:"p99_us"`
}

func main() {
	listen := flag.String("listen", "", "serve on address:port")
	connect := flag.String("connect", "", "measure against address:port")
	length := flag.Duration("t", 3*time.Second, "measured time")
	warm := flag.Duration("warmup", 300*time.Millisecond, "unmeasured transactions first, for this long")
	size := flag.Int("size", 1, "bytes of each request and each answer")
	flag.Parse()
	runtime.LockOSThread()
	var err error
	switch {
	case *listen != "" && *connect == "":
		err = serve(*listen, *size)
	case *connect != "" && *listen == "":
		var r Result
		r, err = client(*connect, *size, *warm, *length)
		if err == nil {
			err = json.NewEncoder(os.Stdout).Encode(r)
		}
	default:
		err = errors.New("give one of -listen and -connect")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tcprr: %v\n", err)
		os.Exit(1)
	}
}

// sockaddr is addr:port as a socket address and its family.
func sockaddr(s string) (unix.Sockaddr, int, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, 0, fmt.Errorf("address %q: %w", s, err)
	}
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, unix.AF_INET, nil
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}, unix.AF_INET6, nil
}

func serve(addr string, size int) error {
	fd, err := listen(addr)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	for {
		if err := serveOne(fd, size); err != nil {
			return err
		}
	}
}

// listen is a blocking listening socket on addr.
func listen(addr string) (int, error) {
	sa, family, err := sockaddr(addr)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen %s: %w", addr, err)
	}
	return fd, nil
}

// serveOne accepts one connection and answers it until the client closes
// it: a measurement is one connection, served one at a time.
func serveOne(fd, size int) error {
	c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	echo(c, size)
	return unix.Close(c)
}

// echo answers every request of size bytes with size bytes until EOF.
func echo(fd, size int) {
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	buf := make([]byte, size)
	for {
		if err := readFull(fd, buf); err != nil {
			return
		}
		if err := writeFull(fd, buf); err != nil {
			return
		}
	}
}

func client(addr string, size int, warm, length time.Duration) (Result, error) {
	sa, family, err := sockaddr(addr)
	if err != nil {
		return Result{}, err
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return Result{}, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != nil {
		return Result{}, fmt.Errorf("connect %s: %w", addr, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return Result{}, fmt.Errorf("TCP_NODELAY: %w", err)
	}
	buf := make([]byte, size)
	one := func() error {
		if err := writeFull(fd, buf); err != nil {
			return err
		}
		return readFull(fd, buf)
	}
	for end := time.Now().Add(warm); time.Now().Before(end); {
		if err := one(); err != nil {
			return Result{}, err
		}
	}
	lat := make([]time.Duration, 0, 1<<16)
	start := time.Now()
	end := start.Add(length)
	last := start
	for last.Before(end) {
		if err := one(); err != nil {
			return Result{}, err
		}
		now := time.Now()
		lat = append(lat, now.Sub(last))
		last = now
	}
	secs := last.Sub(start).Seconds()
	slices.Sort(lat)
	pct := func(p int) float64 {
		i := min(len(lat)-1, (len(lat)*p+99)/100-1)
		return float64(lat[max(i, 0)]) / float64(time.Microsecond)
	}
	return Result{Transactions: len(lat), Seconds: secs, PerSecond: float64(len(lat)) / secs, P50us: pct(50), P99us: pct(99)}, nil
}

func readFull(fd int, b []byte) error {
	for got := 0; got < len(b); {
		n, err := unix.Read(fd, b[got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("connection closed")
		}
		got += n
	}
	return nil
}

func writeFull(fd int, b []byte) error {
	for put := 0; put < len(b); {
		n, err := unix.Write(fd, b[put:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		put += n
	}
	return nil
}
