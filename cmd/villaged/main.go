// Command villaged is Village's node agent and admin CLI. Each subcommand
// lives in its own file (cmd_*.go) and registers itself in init, so the
// parts of the agent stay independent:
//
//	villaged run        keep this node's registration, peer routes and masquerade right
//	villaged sync       one reconcile pass, then exit
//	villaged status     what this node has and what drifted
//	villaged why        whether NetworkPolicy allows a connection, and which rule decides
//	villaged rotate-key give this node a new WireGuard key, with no packet lost
//	villaged install    put binaries and conflist in place atomically
//	villaged uninstall  remove exactly what install added
//	villaged version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/village-cni/village/pkg/buildinfo"
)

// command is one subcommand of villaged.
type command struct {
	name    string
	summary string
	// run gets the arguments after the subcommand name; returning
	// errUsage prints the usage of the subcommand.
	run func(args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

var errUsage = errors.New("usage")

func init() {
	register(command{name: "version", summary: "print the version", run: func(_ []string, stdout, _ io.Writer) error {
		_, err := fmt.Fprintln(stdout, buildinfo.About("villaged"))
		return err
	}})
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: villaged <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		return 2
	}
	if args[0] == "--version" || args[0] == "-version" {
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "villaged: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err := c.run(args[1:], stdout, stderr); err != nil {
		if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
			return 2
		}
		fmt.Fprintf(stderr, "villaged %s: %v\n", c.name, err)
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	return 0
}
