package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/village-cni/village/pkg/agent"
)

// `villaged rotate-key` asks this node's agent for a new WireGuard key
// (backend type wireguard) and waits until the agent has it in its device
// and has published it; peers take it over from the registry with no
// packet lost (see pkg/wireguard, "Rotating the key"). The agent, not this
// command, writes the key file.
func init() {
	register(command{name: "rotate-key", summary: "give this node a new WireGuard key, published to its peers with no packet lost", run: cmdRotateKey})
}

func cmdRotateKey(args []string, stdout, stderr io.Writer) error {
	var opts agent.Options
	fs := agentFlags("rotate-key", stderr, &opts)
	wait := fs.Duration("timeout", time.Minute, "how long to wait for the agent")
	if err := parseAgentFlags(fs, args, &opts); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()
	old, cur, err := agent.RotateKey(ctx, opts)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "WireGuard public key: %s (was %s)\n", cur, old)
	return err
}
