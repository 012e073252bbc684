package plugin

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/ipam/config"
)

// A node whose run directory has no subnet file yet (villaged not back
// after a reboot, while the conflist on disk already says the node can
// network pods) gets ADDs it cannot answer. A runtime that asks STATUS
// holds them back (STATUS says not ready meanwhile); one that does not
// (containerd before 2.0 reads only the conflist) sends them at once, and
// a failed ADD is a FailedCreatePodSandBox Event and a retry with backoff.
// So ADD waits, boundedly, for villaged to publish the lease.

// DefaultLeaseWait bounds how long ADD waits for the subnet file.
const DefaultLeaseWait = 60 * time.Second

// LeaseWaitEnv overrides DefaultLeaseWait (a Go duration such as "2s").
// Meant for tests; runtimes do not set it.
const LeaseWaitEnv = "VILLAGE_IPAM_LEASE_WAIT"

// leasePoll is how often the wait looks for the file.
const leasePoll = 100 * time.Millisecond

// waitForLease returns once the configuration parses without
// config.ErrNotLeased (any other outcome is setup's to report), or after
// the bound; then setup reports the missing lease (code 11).
func waitForLease(args []byte, cniArgs string) error {
	bound := DefaultLeaseWait
	if v := os.Getenv(LeaseWaitEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("%s=%q is not a duration such as 2s", LeaseWaitEnv, v), "")
		}
		bound = d
	}
	deadline := time.Now().Add(bound)
	for {
		_, err := config.Parse(args, cniArgs)
		if !errors.Is(err, config.ErrNotLeased) || !time.Now().Before(deadline) {
			return nil
		}
		time.Sleep(leasePoll)
	}
}

// notLeased is STATUS's answer while the subnet file is missing: not
// ready (code 50, the plugin is not available), so that a runtime that
// asks STATUS keeps the node's network not ready and sends no ADD.
func notLeased(args []byte, cniArgs string) error {
	if _, err := config.Parse(args, cniArgs); errors.Is(err, config.ErrNotLeased) {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return nil
}
