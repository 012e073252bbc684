// Command pause is the sandbox ("pause") process of the pods the runtime
// tests and benchmarks start: it holds the pod's namespaces open until it
// is told to stop (SIGTERM or SIGINT, which as PID 1 it must handle itself).
// With -listen it also answers every TCP connection with -reply and closes
// it, which the tests use as the server behind a hostPort or a Service;
// with -http it answers HTTP requests with -reply and the client's address.
// With -echo it echoes every TCP connection back for as long as it lasts,
// and with -dial it holds one connection to such a server, sending a
// numbered line every -interval and checking the echo: it prints "ok N"
// now and then and exits 1 (naming the error) the moment the connection
// breaks, so a test sees a lost established connection as a restarted or
// failed container.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "", "TCP address to answer on, e.g. :8080")
	reply := flag.String("reply", "pause", "what to write to each connection")
	httpAddr := flag.String("http", "", "HTTP address to answer on with the -reply text and the client's address, e.g. :8080")
	echo := flag.String("echo", "", "TCP address to echo connections on, e.g. :9000")
	dial := flag.String("dial", "", "echo server to hold one connection to, e.g. 10.244.1.5:9000")
	interval := flag.Duration("interval", 200*time.Millisecond, "with -dial: time between lines")
	flag.Parse()
	if *listen != "" {
		serve(*listen, func(c net.Conn) { _, _ = fmt.Fprintln(c, *reply) })
	}
	if *httpAddr != "" {
		go serveHTTP(*httpAddr, *reply)
	}
	if *echo != "" {
		serve(*echo, func(c net.Conn) { _, _ = io.Copy(c, c) })
	}
	if *dial != "" {
		go hold(*dial, *interval)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// serve answers every connection on addr with handle, then closes it.
func serve(addr string, handle func(net.Conn)) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pause: %v\n", err)
		os.Exit(1)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { handle(c); _ = c.Close() }()
		}
	}()
}

// hold keeps one connection to an echo server and exits 1 when it fails.
func hold(addr string, interval time.Duration) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fmt.Printf("broken: dial %s: %v\n", addr, err)
		os.Exit(1)
	}
	fmt.Printf("connected %s -> %s\n", c.LocalAddr(), c.RemoteAddr())
	r := bufio.NewReader(c)
	for n := 1; ; n++ {
		line := fmt.Sprintf("%d\n", n)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, line); err != nil {
			fmt.Printf("broken: write %d: %v\n", n, err)
			os.Exit(1)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != line {
			fmt.Printf("broken: echo of %d: %q %v\n", n, got, err)
			os.Exit(1)
		}
		if n%25 == 0 {
			fmt.Printf("ok %d\n", n)
		}
		time.Sleep(interval)
	}
}

// serveHTTP answers every request on addr with "<reply> <client address>":
// the address the server sees the request come from, after any NAT.
func serveHTTP(addr, reply string) {
	err := http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = fmt.Fprintf(w, "%s %s\n", reply, host)
	}))
	fmt.Fprintf(os.Stderr, "pause: %v\n", err)
	os.Exit(1)
}
