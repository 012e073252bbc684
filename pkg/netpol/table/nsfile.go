package table

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/nodelocal"
)

// NamespacesName is the file under <run dir>/<network>/ where the agent
// lists, one a line, the namespaces that hold a NetworkPolicy. ADD reads it
// to decide whether a new pod may be isolated: only a pod of a listed
// namespace is marked pending (a policy selects pods of its own namespace
// only), so pods elsewhere never wait for the agent. Without the file (the
// controller off, or not started) ADD marks nothing.
const NamespacesName = nodelocal.PolicyNamespacesName

// NamespacesPath is the file of network under runDir ("" = the run
// directory, nodelocal.PolicyNamespaces).
func NamespacesPath(runDir, network string) string {
	return nodelocal.PolicyNamespaces(runDir, network)
}

// WriteNamespaces replaces the file atomically.
func WriteNamespaces(path string, namespaces []string) error {
	body := strings.Join(namespaces, "\n")
	if body != "" {
		body += "\n"
	}
	return nodelocal.WriteFile(path, []byte(body), 0o644)
}

// readNamespaces reads the file; ok false when it is missing.
func readNamespaces(path string) (nss []string, ok bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("failed to read %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			nss = append(nss, l)
		}
	}
	return nss, true, sc.Err()
}

// MarkNewPod is what ADD does for a pod of namespace with addresses ips:
// when the namespace holds a policy, the addresses are marked pending
// until the agent has compiled the pod. It reports whether it marked.
//
// With enforcing (the network's "networkPolicy": true) a missing pending
// table is made, as MarkUntilReady makes it: the namespaces file says a
// controller compiled here, so the table is gone under it (`nft flush
// ruleset`, a firewall reload) and the controller has not put it back
// yet; an ADD in that moment must not leave the pod unmarked, reachable
// until the pod is compiled. Without enforcing, a missing table means no
// controller (ErrNoController): nothing is marked.
func MarkNewPod(runDir, network, bridge, namespace string, ips []netip.Addr, enforcing bool) (bool, error) {
	if namespace == "" || len(ips) == 0 {
		return false, nil
	}
	nss, ok, err := readNamespaces(NamespacesPath(runDir, network))
	if err != nil || !ok || !slices.Contains(nss, namespace) {
		return false, err
	}
	if enforcing {
		if err := markEnsuring(network, bridge, ips); err != nil {
			return false, err
		}
		return true, nil
	}
	if err := MarkPending(network, ips); err != nil {
		if errors.Is(err, ErrNoController) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Fail-closed start-up. On a network with "networkPolicy": true, a new pod
// is marked pending whatever the namespaces file says until this node's
// policy controller has its first compile in the kernel. The sign of that
// is the ready file, <run dir>/<network>/policy-ready, held under an
// exclusive flock by the controller that wrote it for as long as it runs:
//
//   - first boot, or after a reboot: the run directory (a tmpfs) holds no
//     ready file, so everything is pending;
//   - the agent stopped, killed or restarting: the kernel drops its lock
//     with its last descriptor, so the file left behind is not ready;
//   - the controller's first Apply succeeded: it creates the file and
//     holds it; from then on the namespaces file decides (MarkNewPod).
//
// The lock ties the file to the running controller without pids (the
// agent runs in a pod of its own pid namespace; the plugin in the
// runtime's): flock is on the file, which both see through /run/village.

// ReadyName is the ready file under <run dir>/<network>/.
const ReadyName = nodelocal.PolicyReadyName

// ReadyPath is the ready file of network under runDir ("" = the default
// run directory).
func ReadyPath(runDir, network string) string {
	return nodelocal.PolicyReady(runDir, network)
}

// IsReady reports whether a running controller holds the ready file at
// path: false when the file is missing or nobody holds its lock.
func IsReady(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("failed to open %s: %w", path, err)
	}
	defer f.Close()
	// A shared lock we can take means no exclusive holder: the file is a
	// leftover of a controller that is gone. Taken, it goes with f.
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); {
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("failed to test the lock of %s: %w", path, err)
	}
	return false, nil
}

// HoldReady creates the ready file at path (root-only, 0600; an existing
// file's mode is put back) and holds its exclusive lock until the returned
// file is closed (or the process ends). The controller calls it once its
// first compile is in the kernel. The lock is taken without waiting: a
// plugin holds its shared lock for a moment only, so a lock held for
// longer than a few tries is someone else's, reported as an error rather
// than hanging the controller.
func HoldReady(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("failed to make %s: %w", filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", path, err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("failed to make %s root-only: %w", path, err)
	}
	for try := 0; ; try++ {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || try == readyTries {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("failed to lock %s: another process holds its lock: %w", path, err)
			}
			return nil, fmt.Errorf("failed to lock %s: %w", path, err)
		}
		time.Sleep(readyRetry)
	}
}

// readyTries and readyRetry bound HoldReady's wait for a plugin's shared
// lock (held for one stat and flock): about a second in all.
const (
	readyTries = 50
	readyRetry = 20 * time.Millisecond
)

// MarkUntilReady is what ADD does first for a pod with addresses ips on a
// network with "networkPolicy": true: while no controller holds the ready
// file, the addresses are marked pending, the pending table made when it
// is missing (after a reboot the kernel has none). It reports whether it
// marked; when it did not, MarkNewPod decides. bridge is the network's
// bridge (Ruleset.Bridge).
func MarkUntilReady(runDir, network, bridge string, ips []netip.Addr) (bool, error) {
	if len(ips) == 0 {
		return false, nil
	}
	ready, err := IsReady(ReadyPath(runDir, network))
	if err != nil || ready {
		return false, err
	}
	if err := markEnsuring(network, bridge, ips); err != nil {
		return false, fmt.Errorf("no policy compile on this node yet: %w", err)
	}
	return true, nil
}

// markEnsuring marks ips pending in one transaction that also makes the
// network's pending table (with bridge, Ruleset.Bridge) when it is
// missing.
func markEnsuring(network, bridge string, ips []netip.Addr) error {
	c, err := open()
	if err != nil {
		return fmt.Errorf("failed to open nftables: %w", err)
	}
	if ok, err := tableExists(c, PendingTable(network)); err != nil {
		return err
	} else if !ok {
		if err := ensurePending(c, network, bridge); err != nil {
			return fmt.Errorf("pending table of network %q: %w", network, err)
		}
	}
	if err := queueMarks(c, network, ips); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("failed to mark %v pending in table inet %s: %w", ips, PendingTable(network), err)
	}
	return nil
}
