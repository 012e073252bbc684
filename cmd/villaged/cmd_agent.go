package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/village-cni/village/pkg/agent"
	"github.com/village-cni/village/pkg/metrics"
)

// The agent's subcommands: run, sync, status. The work is in pkg/agent.
func init() {
	register(command{name: "run", summary: "register this node, lease its pod subnet, keep peer routes and masquerade right", run: cmdRun})
	register(command{name: "sync", summary: "one reconcile pass (static peers and the registry's list), then exit", run: cmdSync})
	register(command{name: "status", summary: "this node, its subnet, its peers and what drifted (exit 1 on drift)", run: cmdStatus})
}

// errDrift makes status exit non-zero after printing its report.
var errDrift = errors.New("drift found (see above)")

func agentFlags(name string, stderr io.Writer, opts *agent.Options) *flag.FlagSet {
	fs := flag.NewFlagSet("villaged "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opts.ConfFile, "conf", "", "the network configuration: a .conflist (its \"village\" plugin) or a .conf (required)")
	fs.StringVar(&opts.NodeName, "node-name", "", "this node's name in the registry and its Node object (default: $NODE_NAME, else the host name)")
	fs.StringVar(&opts.RunDir, "run-dir", "", "where leased subnets are published (default: $VILLAGE_RUN_DIR or /run/village)")
	return fs
}

func parseAgentFlags(fs *flag.FlagSet, args []string, opts *agent.Options) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %v\n", fs.Args())
		fs.Usage()
		return errUsage
	}
	if opts.ConfFile == "" {
		fmt.Fprintln(fs.Output(), "--conf is required")
		fs.Usage()
		return errUsage
	}
	return nil
}

func cmdRun(args []string, _, stderr io.Writer) error {
	var opts agent.Options
	fs := agentFlags("run", stderr, &opts)
	fs.DurationVar(&opts.Period, "period", agent.DefaultPeriod, "the tick: held peers, reclaim, metrics, legacy iptables rules (no notifications), and a full pass while kernel notifications may have been lost or after a failed pass")
	fs.DurationVar(&opts.SafetyNet, "safety-net", agent.DefaultSafetyNet, "mean time between full passes that read the whole kernel back when no notification asked for one (jittered 0.8-1.2; never shorter than --period); also the NetworkPolicy repair and the kubernetes registry resync")
	fs.StringVar(&opts.MetricsAddr, "metrics-addr", metrics.DefaultAddr, "where to serve /metrics, /healthz and /readyz (\"off\" for nowhere)")
	fs.StringVar(&opts.DHCPDir, "dhcp-dir", "", "where the LAN pods' DHCP leases are kept across restarts, with macvlan.ipam type dhcp (default /var/lib/village/dhcp)")
	fs.StringVar(&opts.PublishConfDir, "publish-conf-dir", "", "CNI config directory to copy the --conf conflist into once the node holds its pod subnet (with `villaged install --stage-dir`)")
	if err := parseAgentFlags(fs, args, &opts); err != nil {
		return err
	}
	if opts.MetricsAddr == "off" {
		opts.MetricsAddr = ""
	}
	lg := log.New(stderr, "villaged: ", log.LstdFlags|log.Lmicroseconds)
	opts.Logf = lg.Printf
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return agent.Run(ctx, opts)
}

func oneShot(args []string, stderr io.Writer, name string) (agent.Options, context.Context, func(), error) {
	var opts agent.Options
	fs := agentFlags(name, stderr, &opts)
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	if err := parseAgentFlags(fs, args, &opts); err != nil {
		return opts, nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	return opts, ctx, func() { cancel(); stop() }, nil
}

func cmdSync(args []string, stdout, stderr io.Writer) error {
	opts, ctx, done, err := oneShot(args, stderr, "sync")
	if err != nil {
		return err
	}
	defer done()
	return agent.Sync(ctx, opts, stdout)
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	opts, ctx, done, err := oneShot(args, stderr, "status")
	if err != nil {
		return err
	}
	defer done()
	clean, err := agent.Status(ctx, opts, stdout)
	if err != nil {
		return err
	}
	if !clean {
		return errDrift
	}
	return nil
}
