package table

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"

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
func MarkNewPod(runDir, network, namespace string, ips []netip.Addr) (bool, error) {
	if namespace == "" || len(ips) == 0 {
		return false, nil
	}
	nss, ok, err := readNamespaces(NamespacesPath(runDir, network))
	if err != nil || !ok || !slices.Contains(nss, namespace) {
		return false, err
	}
	if err := MarkPending(network, ips); err != nil {
		if errors.Is(err, ErrNoController) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}
