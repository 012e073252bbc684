// Command mdnsdemo is the demo's stand-in for a home-lab service that
// announces itself by multicast DNS (Home Assistant, a printer, a media
// server): "serve" answers IPv4 address questions for one .local name, and
// "query" asks for one from another host, the way a laptop's resolver does.
// It exists so that scripts/demo.sh can show a LAN pod found by name from
// the LAN without installing Avahi; it is not shipped.
//
//	mdnsdemo serve -iface net1 -name village-demo.local -addr 192.168.50.200 -for 2m
//	mdnsdemo query -iface eth0 -name village-demo.local -timeout 5s
//
// serve joins 224.0.0.251 on the interface and answers a question for its
// name (class IN, type A or ANY). A question from port 5353 is answered to
// the group, one from any other port straight to the asker (RFC 6762 §6.7,
// "legacy unicast"), which is how query asks. query prints the address and
// who answered, and exits 1 when no answer came in time.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/net/ipv4"
)

// group is mDNS's IPv4 group and port.
var group = &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5353}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "query":
		err = query(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mdnsdemo:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: mdnsdemo serve -iface IF -name NAME.local -addr IPv4 [-for D] | query -iface IF -name NAME.local [-timeout D]")
	os.Exit(2)
}

// fqdn is name as a DNS name: lower case, with the final dot.
func fqdn(name string) (dnsmessage.Name, error) {
	name = strings.ToLower(strings.TrimSuffix(name, ".")) + "."
	if !strings.HasSuffix(name, ".local.") {
		return dnsmessage.Name{}, fmt.Errorf("name %q: mDNS names end in .local", name)
	}
	return dnsmessage.NewName(name)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	ifName := fs.String("iface", "", "interface to listen on")
	nameArg := fs.String("name", "", "the .local name to answer for")
	addrArg := fs.String("addr", "", "the IPv4 address to answer with")
	life := fs.Duration("for", 2*time.Minute, "exit after this long (the demo's own bound)")
	_ = fs.Parse(args)
	name, err := fqdn(*nameArg)
	if err != nil {
		return err
	}
	addr, err := netip.ParseAddr(*addrArg)
	if err != nil || !addr.Is4() {
		return fmt.Errorf("address %q: want an IPv4 address", *addrArg)
	}
	ifi, err := net.InterfaceByName(*ifName)
	if err != nil {
		return fmt.Errorf("interface %q: %w", *ifName, err)
	}
	conn, err := net.ListenMulticastUDP("udp4", ifi, group)
	if err != nil {
		return fmt.Errorf("join %s on %s: %w", group, ifi.Name, err)
	}
	defer conn.Close()
	pc := ipv4.NewPacketConn(conn)
	if err := pc.SetMulticastInterface(ifi); err != nil {
		return fmt.Errorf("multicast interface %s: %w", ifi.Name, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(*life))
	buf := make([]byte, 9000)
	for {
		n, from, err := conn.ReadFromUDP(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read on %s: %w", ifi.Name, err)
		}
		reply, ok := answer(buf[:n], name, addr)
		if !ok {
			continue
		}
		to := from
		if from.Port == group.Port {
			to = group
		}
		if _, err := conn.WriteToUDP(reply, to); err != nil {
			fmt.Fprintf(os.Stderr, "mdnsdemo: answer %s: %v\n", to, err)
			continue
		}
		fmt.Printf("answered %s: %s is at %s\n", from.IP, strings.TrimSuffix(name.String(), "."), addr)
	}
}

// answer is the response to the query msg when it asks for name, with the
// query's ID and question echoed (legacy unicast askers need both).
func answer(msg []byte, name dnsmessage.Name, addr netip.Addr) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil, false
	}
	for _, q := range qs {
		if !strings.EqualFold(q.Name.String(), name.String()) || (q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeALL) {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
		b.EnableCompression()
		_ = b.StartQuestions()
		_ = b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		_ = b.StartAnswers()
		if err := b.AResource(dnsmessage.ResourceHeader{Name: name, Class: dnsmessage.ClassINET, TTL: 120}, dnsmessage.AResource{A: addr.As4()}); err != nil {
			return nil, false
		}
		out, err := b.Finish()
		return out, err == nil
	}
	return nil, false
}

func query(args []string) error {
	fs := flag.NewFlagSet("query", flag.ExitOnError)
	ifName := fs.String("iface", "", "interface to ask on")
	nameArg := fs.String("name", "", "the .local name to look up")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for an answer")
	_ = fs.Parse(args)
	name, err := fqdn(*nameArg)
	if err != nil {
		return err
	}
	ifi, err := net.InterfaceByName(*ifName)
	if err != nil {
		return fmt.Errorf("interface %q: %w", *ifName, err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer conn.Close()
	if err := ipv4.NewPacketConn(conn).SetMulticastInterface(ifi); err != nil {
		return fmt.Errorf("multicast interface %s: %w", ifi.Name, err)
	}
	const id = 0x5a17
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return fmt.Errorf("build query: %w", err)
	}
	deadline := time.Now().Add(*timeout)
	buf := make([]byte, 9000)
	// Ask again every second until an answer comes: the first packet can
	// meet a LAN still learning where the pod's MAC is.
	for time.Now().Before(deadline) {
		if _, err := conn.WriteToUDP(q, group); err != nil {
			return fmt.Errorf("ask on %s: %w", ifi.Name, err)
		}
		_ = conn.SetReadDeadline(minTime(deadline, time.Now().Add(time.Second)))
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				break
			}
			if a, ok := parseAnswer(buf[:n], id, name); ok {
				fmt.Printf("%s is at %s (answered by %s)\n", strings.TrimSuffix(name.String(), "."), a, from.IP)
				return nil
			}
		}
	}
	return fmt.Errorf("no answer for %s on %s within %s", strings.TrimSuffix(name.String(), "."), ifi.Name, *timeout)
}

// parseAnswer is the A record for name in the response msg to query id.
func parseAnswer(msg []byte, id uint16, name dnsmessage.Name) (netip.Addr, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || !h.Response || h.ID != id {
		return netip.Addr{}, false
	}
	if err := p.SkipAllQuestions(); err != nil {
		return netip.Addr{}, false
	}
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			return netip.Addr{}, false
		}
		if rh.Type != dnsmessage.TypeA || !strings.EqualFold(rh.Name.String(), name.String()) {
			if err := p.SkipAnswer(); err != nil {
				return netip.Addr{}, false
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4(a.A), true
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
