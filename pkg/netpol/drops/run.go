package drops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/florianl/go-nflog/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/netpol/table"
	"github.com/village-cni/village/pkg/nodelocal"
)

// CopyRange is how much of a sampled packet the kernel copies to the
// agent: an IPv6 header with some extension headers and the ports.
const CopyRange = 128

// Config says what Run listens for and where it writes.
type Config struct {
	// Network is whose samples are kept (the prefix says it).
	Network string
	RunDir  string
	// Recorder aggregates the samples; the controller sets its names.
	Recorder *Recorder
	// Sampled is called with the direction of each sample kept (the
	// samples metric); nil: nothing.
	Sampled func(direction string)
	Logf    func(string, ...any)
	// NetNS is a file descriptor of the network namespace to listen in
	// (0: the calling thread's, the node's for villaged).
	NetNS int
}

// Run listens on NFLOG group table.LogGroup in the node's network
// namespace (Config.NetNS) until ctx is done, and writes the drops file at most
// every WriteEvery when it changed. An error when it cannot listen (the
// group is another agent's: see the package comment).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	// QThresh 1: the kernel sends each sample as it comes. By default it
	// batches them for up to a second (NFULNL_TIMEOUT_DEFAULT), which
	// made a single drop reach `villaged drops` 1.3 s after it happened;
	// the rate limit keeps the messages few.
	nf, err := nflog.Open(&nflog.Config{NetNS: cfg.NetNS, Group: table.LogGroup, Copymode: nflog.CopyPacket, Bufsize: CopyRange, QThresh: 1})
	if err != nil {
		return fmt.Errorf("NFLOG group %d: %w", table.LogGroup, err)
	}
	defer nf.Close()
	// A burst past the socket's buffer loses samples, not the listener.
	if err := nf.SetOption(netlink.NoENOBUFS, true); err != nil {
		return fmt.Errorf("NFLOG group %d: %w", table.LogGroup, err)
	}
	rec := cfg.Recorder
	hook := func(a nflog.Attribute) int {
		if a.Prefix == nil || a.Payload == nil {
			return 0
		}
		if dir, ok := rec.Add(*a.Prefix, *a.Payload, time.Now()); ok && cfg.Sampled != nil {
			cfg.Sampled(dir)
		}
		return 0
	}
	stopped := make(chan struct{})
	onErr := func(err error) int {
		if ctx.Err() != nil {
			close(stopped)
			return 1
		}
		var oe *netlink.OpError
		if errors.Is(err, unix.ENOBUFS) || (errors.As(err, &oe) && oe.Timeout()) {
			return 0
		}
		cfg.Logf("policy drop samples: %v: no more samples until the agent restarts", err)
		close(stopped)
		return 1
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, onErr); err != nil {
		return fmt.Errorf("NFLOG group %d: %w", table.LogGroup, err)
	}
	path := Path(cfg.RunDir, cfg.Network)
	write := func() {
		f, changed := rec.File(time.Now().UTC())
		if !changed {
			return
		}
		b, err := json.Marshal(f)
		if err == nil {
			// Root only: who tried to reach whom across the cluster.
			err = nodelocal.WriteFile(path, b, 0o600)
		}
		if err != nil {
			cfg.Logf("policy drops: %v", err)
		}
	}
	tick := time.NewTicker(WriteEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			write()
			return nil
		case <-stopped:
			write()
			return nil
		case <-tick.C:
			write()
		}
	}
}
