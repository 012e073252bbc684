// Command pause is the sandbox ("pause") process of the pods the runtime
// tests and benchmarks start: it holds the pod's namespaces open until it
// is told to stop (SIGTERM or SIGINT, which as PID 1 it must handle itself).
// With -listen it also answers every TCP connection with -reply and closes
// it, which the tests use as the server behind a hostPort.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	listen := flag.String("listen", "", "TCP address to answer on, e.g. :8080")
	reply := flag.String("reply", "pause", "what to write to each connection")
	flag.Parse()
	if *listen != "" {
		l, err := net.Listen("tcp", *listen)
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
				_, _ = fmt.Fprintln(c, *reply)
				_ = c.Close()
			}
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
