package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/village-cni/village/pkg/agent"
	"github.com/village-cni/village/pkg/netpol"
	"github.com/village-cni/village/pkg/netpol/controller"
	"github.com/village-cni/village/pkg/netpol/table"
)

// `villaged why FROM TO [PORT[/PROTO]]` says whether NetworkPolicy allows
// a connection and which policies and rules decide, from the model the
// node's policy controller wrote beside the table it put in the kernel
// (netpol.Model): it needs neither the API server nor the agent running.
// Exit 0 allowed, 1 denied, 2 a usage error or no answer.
func init() {
	register(command{name: "why", summary: "whether NetworkPolicy allows FROM -> TO [PORT[/PROTO]], and which policy and rule decide (exit 0 allowed, 1 denied)", run: cmdWhy})
}

// errDenied makes why exit 1 after printing its verdict.
var errDenied = errors.New("denied (see above)")

// exitError makes runMain exit with code after printing err: for a
// command whose exit status says more than failed or not (why: 1 is a
// verdict, so its errors are 2).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

func cmdWhy(args []string, stdout, stderr io.Writer) error {
	var opts agent.Options
	fs := agentFlags("why", stderr, &opts)
	asJSON := fs.Bool("json", false, "print the verdict as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: villaged why --conf FILE [--node-name NAME] [--run-dir DIR] [--json] FROM TO [PORT[/PROTO]]")
		fmt.Fprintln(stderr, "  FROM, TO   namespace/pod, or an IP address")
		fmt.Fprintln(stderr, "  PORT       the destination port; PROTO tcp (default), udp or sctp; without PORT: any port")
		fs.PrintDefaults()
	}
	// flags may come before, between or after the arguments
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, format+"\n", a...)
		fs.Usage()
		return errUsage
	}
	if opts.ConfFile == "" {
		return usage("--conf is required")
	}
	if len(pos) < 2 || len(pos) > 3 {
		return usage("want FROM TO [PORT[/PROTO]], got %q", pos)
	}
	var port uint16
	proto := table.ProtoAny
	if len(pos) == 3 {
		var err error
		if port, proto, err = ParsePortProto(pos[2]); err != nil {
			return usage("%v", err)
		}
	}
	from, err := parseEndpoint(pos[0])
	if err != nil {
		return usage("FROM: %v", err)
	}
	to, err := parseEndpoint(pos[1])
	if err != nil {
		return usage("TO: %v", err)
	}
	fail := func(err error) error { return exitError{2, err} }
	c, err := agent.Load(opts)
	if err != nil {
		return fail(err)
	}
	if !c.Net.NetworkPolicy {
		return fail(fmt.Errorf("NetworkPolicy is off on network %s (%s has no \"networkPolicy\": true): nothing is filtered", c.Net.Name, c.File))
	}
	path := controller.ModelPath(opts.RunDir, c.Net.Name)
	m, err := controller.ReadModel(opts.RunDir, c.Net.Name)
	if err != nil {
		return fail(err)
	}
	if m == nil {
		return fail(fmt.Errorf("the policy controller of network %s has not compiled yet (no %s): is `villaged run` running on this node?", c.Net.Name, path))
	}
	own := nodeAddrs()
	from.Node, to.Node = own[from.IP], own[to.IP]
	v, err := netpol.Explain(m, from, to, port, proto)
	if err != nil {
		return fail(err)
	}
	if *asJSON {
		b, _ := json.MarshalIndent(v, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintln(stdout, v.Summary)
		for _, s := range []struct {
			dir  string
			side netpol.Side
		}{{"egress", v.Egress}, {"ingress", v.Ingress}} {
			fmt.Fprintf(stdout, "  %-8s %s\n", s.dir+":", s.side.Reason)
		}
		if fi, err := os.Stat(path); err == nil {
			fmt.Fprintf(stdout, "  (as compiled on this node at %s UTC)\n", fi.ModTime().UTC().Format("2006-01-02 15:04:05"))
		}
	}
	if !v.Allowed {
		return errDenied
	}
	return nil
}

// ParsePortProto parses PORT[/PROTO]: a port 1-65535 and tcp (the
// default, as in a NetworkPolicy port without protocol), udp or sctp, in
// any case.
func ParsePortProto(s string) (uint16, table.Proto, error) {
	num, name, slash := strings.Cut(s, "/")
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return 0, 0, fmt.Errorf("port %q: want a number from 1 to 65535, optionally /tcp, /udp or /sctp", s)
	}
	proto := table.ProtoTCP
	if slash {
		switch strings.ToLower(name) {
		case "tcp":
		case "udp":
			proto = table.ProtoUDP
		case "sctp":
			proto = table.ProtoSCTP
		default:
			return 0, 0, fmt.Errorf("port %q: protocol %q: want tcp, udp or sctp", s, name)
		}
	}
	return uint16(n), proto, nil
}

// parseEndpoint reads namespace/pod or an IP address.
func parseEndpoint(s string) (netpol.Endpoint, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return netpol.Endpoint{IP: ip.Unmap()}, nil
	}
	ns, pod, ok := strings.Cut(s, "/")
	if !ok || ns == "" || pod == "" || strings.Contains(pod, "/") {
		return netpol.Endpoint{}, fmt.Errorf("%q: want namespace/pod or an IP address", s)
	}
	return netpol.Endpoint{Pod: s}, nil
}

// nodeAddrs are the addresses of this node (the network namespace why
// runs in): traffic between them and the node's pods is never filtered.
func nodeAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out
}
