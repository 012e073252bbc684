// Package nodelocal is the node-local contract between villaged and the
// binaries a runtime execs on the same host (village, village-ipam and its
// store helpers): the run directory and every file and socket under it,
// the one way such a file is written (atomically), this node's name as the
// agent resolved it, and the host-side kubeconfig the agent keeps for
// village-ipam-kube. It links the standard library only, so every plugin
// may import it.
//
// The run directory is $VILLAGE_RUN_DIR, else /run/village. Under it:
//
//	<run dir>/agent.sock                 the agent's one socket: LAN pods and their DHCP leases (pkg/agentsock)
//	<run dir>/<network>/subnet           the node's leased pod subnet(s) (pkg/subnetfile)
//	<run dir>/<network>/node-name        this node's name, as the agent resolved it
//	<run dir>/<network>/policy-namespaces  namespaces holding a NetworkPolicy (pkg/netpol/table)
//	<run dir>/<network>/policy-status.json what the policy controller last did
//	<run dir>/<network>/policy-model.json  what it compiled, per pod and rule, for `villaged why` (pkg/netpol Model; root-only)
//	<run dir>/<network>/policy-drops.json  the latest packets NetworkPolicy dropped, named, for `villaged drops` (pkg/netpol/drops; root-only)
//	<run dir>/<network>/wireguard-rotate.json a request for a new WireGuard key, written by `villaged rotate-key` (root-only)
//	<run dir>/<network>/wireguard-key.json    the agent's WireGuard public key, since when, and the last request it served
//	<run dir>/<network>/overlay-peers.json    the overlay's last view of the registry, for a restart while it cannot be reached (pkg/agent)
//	<run dir>/macspoofchk/<network>/<veth> a pod port's MAC for macspoofchk (pkg/masq)
//	<run dir>/kube/{kubeconfig,token,ca.crt} the host-side credentials of a kubernetes LAN pool
//
// Functions taking a runDir treat "" as RunDir().
package nodelocal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultRunDir is the run directory when RunDirEnv is not set.
const (
	DefaultRunDir = "/run/village"
	RunDirEnv     = "VILLAGE_RUN_DIR"
)

// File and socket names under the run directory.
const (
	// SubnetName is the file under <run dir>/<network>/ holding the leased
	// pod subnet(s).
	SubnetName = "subnet"
	// NodeNameName is the file under <run dir>/<network>/ where the agent
	// publishes the node name it runs as.
	NodeNameName = "node-name"
	// PolicyNamespacesName lists the namespaces holding a NetworkPolicy.
	PolicyNamespacesName = "policy-namespaces"
	// PolicyStatusName is the policy controller's status file.
	PolicyStatusName = "policy-status.json"
	// PolicyModelName is what the policy controller last put in the
	// kernel, per pod and rule (pkg/netpol Model), read by `villaged why`.
	PolicyModelName = "policy-model.json"
	// PolicyDropsName is the latest packets the policy tables dropped,
	// aggregated and named (pkg/netpol/drops), read by `villaged drops`.
	PolicyDropsName = "policy-drops.json"
	// PolicyReadyName is the file the policy controller holds locked
	// from its first compile in the kernel on (fail-closed start-up).
	PolicyReadyName = "policy-ready"
	// LANServicesStatusName is the LAN Services' status file: the
	// addresses this node answers for ("macvlan.services").
	LANServicesStatusName = "lan-services.json"
	// LANServicesKeptName is what the LAN Services last knew from the API
	// server (the wants and the peers' gossip addresses), kept across an
	// agent's restarts on this boot so that it answers and fails over
	// while the control plane is down.
	LANServicesKeptName = "lan-services-kept.json"
	// ConfinementStatusName is the agent's API confinement verdict
	// (pkg/agent confine.go), read by `villaged status`.
	ConfinementStatusName = "confinement.json"
	// WireGuardRotateName is a request for a new WireGuard key: written
	// by `villaged rotate-key` only, read by the agent.
	WireGuardRotateName = "wireguard-rotate.json"
	// WireGuardKeyName is the agent's WireGuard key status: written by
	// the agent only, read by `villaged rotate-key`.
	WireGuardKeyName = "wireguard-key.json"
	// OverlayPeersName is the overlay's peers as the registry last gave
	// them, kept across the agent's restarts on this boot so that a
	// restart while the registry cannot be reached programs them again.
	OverlayPeersName = "overlay-peers.json"
	// AgentSocketName is the agent's socket.
	AgentSocketName = "agent.sock"
	// SpoofDirName holds macspoofchk's per-port MAC records.
	SpoofDirName = "macspoofchk"
	// HostCredsDirName holds the host-side Kubernetes credentials.
	HostCredsDirName = "kube"
)

// DHCPLeaseDir is where villaged keeps the LAN pods' DHCP leases. It is
// deliberately not under the run directory: a lease must outlive a reboot
// of the agent's tmpfs as long as the server granted it.
const DHCPLeaseDir = "/var/lib/village/dhcp"

// RunDir is $VILLAGE_RUN_DIR or DefaultRunDir.
func RunDir() string {
	if d := os.Getenv(RunDirEnv); d != "" {
		return d
	}
	return DefaultRunDir
}

func dir(runDir string) string {
	if runDir == "" {
		return RunDir()
	}
	return runDir
}

// NetworkDir is network's directory under runDir.
func NetworkDir(runDir, network string) string { return filepath.Join(dir(runDir), network) }

// SubnetFile is network's subnet file.
func SubnetFile(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), SubnetName)
}

// NodeNameFile is where the agent of network publishes its node name.
func NodeNameFile(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), NodeNameName)
}

// PolicyNamespaces is network's policy-namespaces file.
func PolicyNamespaces(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), PolicyNamespacesName)
}

// PolicyReady is network's policy-ready file.
func PolicyReady(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), PolicyReadyName)
}

// PolicyStatus is network's policy status file.
func PolicyStatus(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), PolicyStatusName)
}

// PolicyModel is network's policy model file.
func PolicyModel(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), PolicyModelName)
}

// PolicyDrops is network's policy drops file.
func PolicyDrops(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), PolicyDropsName)
}

// LANServicesStatus is network's LAN Services status file.
func LANServicesStatus(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), LANServicesStatusName)
}

// ConfinementStatus is network's agent's API confinement verdict file.
func ConfinementStatus(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), ConfinementStatusName)
}

// LANServicesKept is network's kept LAN Services state.
func LANServicesKept(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), LANServicesKeptName)
}

// WireGuardRotate is network's WireGuard key rotation request.
func WireGuardRotate(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), WireGuardRotateName)
}

// WireGuardKey is network's WireGuard key status file.
func WireGuardKey(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), WireGuardKeyName)
}

// OverlayPeers is network's kept overlay peers.
func OverlayPeers(runDir, network string) string {
	return filepath.Join(NetworkDir(runDir, network), OverlayPeersName)
}

// AgentSocket is the agent's socket.
func AgentSocket(runDir string) string { return filepath.Join(dir(runDir), AgentSocketName) }

// SpoofDir is network's macspoofchk directory.
func SpoofDir(runDir, network string) string {
	return filepath.Join(dir(runDir), SpoofDirName, network)
}

// HostCredsDir holds the host-side Kubernetes credentials the agent writes.
func HostCredsDir(runDir string) string { return filepath.Join(dir(runDir), HostCredsDirName) }

// HostKubeconfig is the kubeconfig the agent writes for village-ipam-kube.
func HostKubeconfig(runDir string) string { return filepath.Join(HostCredsDir(runDir), "kubeconfig") }

// PublishedKubeconfig is the kubeconfig a kubernetes store block without
// "kubeconfig" means: the one the agent publishes in the run directory. A
// Kubernetes pod's ADD (KubernetesADD) waits for it within AgentWait: after
// a reboot the agent publishes its node name as it starts and these
// credentials only once its TokenRequest is answered, and an ADD between
// the two must not fail. Past that, or for any other caller at once, it
// fails naming the path (a plugin runs on the host, so in-cluster
// credentials never apply to it).
func PublishedKubeconfig() (string, error) {
	p := HostKubeconfig("")
	_, err := os.Stat(p)
	if err != nil && errors.Is(err, fs.ErrNotExist) && KubernetesADD() {
		err = waitFile(p)
	}
	if err != nil {
		return "", fmt.Errorf("no \"kubeconfig\" in the store block and villaged has published none at %s (it writes one while it runs with a LAN pool whose store is kubernetes; or name a kubeconfig): %w", p, err)
	}
	return p, nil
}

// PublishNodeName records name as the node name of network's agent.
func PublishNodeName(runDir, network, name string) error {
	return WriteFile(NodeNameFile(runDir, network), []byte(name+"\n"), 0o644)
}

// NodeName is this node's name for network as the stores must record it:
// the name the agent published (NodeNameFile), else $NODE_NAME. Past
// those it depends on who asks:
//   - a Kubernetes pod's ADD (KubernetesADD) waits, within AgentWait, for
//     the agent to publish its name, and fails with ErrNodeNameNotPublished
//     at the bound: after a reboot the run directory is empty until the
//     agent is back, and an address recorded under the host name (which
//     need not be the Node's name) is one the reclaim of a departed
//     "node" by that name would free under a live pod;
//   - any other use (standalone, without an agent; or a verb that records
//     no name) takes the host name in lower case, DefaultNodeName's rule,
//     the one the agent itself follows without --node-name.
//
// The caller validates the name.
func NodeName(network string) (string, error) {
	n, err := publishedNodeName(network)
	if err != nil || n != "" {
		return n, err
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	if KubernetesADD() {
		return waitNodeName(network)
	}
	return HostNodeName()
}

// publishedNodeName is the name the agent of network published, "" when
// none is.
func publishedNodeName(network string) (string, error) {
	b, err := os.ReadFile(NodeNameFile("", network))
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return "", fmt.Errorf("reading the node name the agent published: %w", err)
}

// DefaultNodeName is the node name when none is given: $NODE_NAME, else the
// host name in lower case, as kubelet names the Node it registers.
func DefaultNodeName() (string, error) {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	return HostNodeName()
}

// HostNodeName is the host name in lower case (a host name may carry
// capitals, a Node name may not).
func HostNodeName() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("failed to read the host name: %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

// TempInfix is in the name of WriteFile's temporary file, after a dot and
// the file's own name: ".<name>.village-tmp-<random>".
const TempInfix = ".village-tmp-"

// ReadJSON decodes the JSON file at path (one of the files above, which
// their writers replace atomically) into v. found is false, with no
// error, when the file is missing; an error names the file.
func ReadJSON(path string, v any) (found bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", path, err)
	}
	return true, nil
}

// WriteFile replaces path with data atomically: a temporary file in the
// same directory (made when missing, 0755), written, given perm, synced,
// renamed over path, and the directory synced. A crash leaves the old
// content or the new one, never a part.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return WriteFrom(path, strings.NewReader(string(data)), perm)
}

// WriteFrom is WriteFile with the content read from r.
func WriteFrom(path string, r io.Reader, perm fs.FileMode) error {
	d, base := filepath.Split(path)
	if d == "" {
		d = "."
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(d, "."+base+TempInfix+"*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; cleans up a failure
	_, err = io.Copy(tmp, r)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return SyncDir(d)
}

// SyncDir fsyncs a directory, so a rename or removal in it is durable.
func SyncDir(d string) error {
	f, err := os.Open(d)
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", d, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", d, err)
	}
	return nil
}
