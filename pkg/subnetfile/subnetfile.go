// Package subnetfile is the file through which villaged hands a node's
// leased pod subnets to village-ipam: <run dir>/<network>/subnet, one CIDR
// per line (one range set each), '#' comments allowed. villaged writes it
// (Write) after leasing; village-ipam reads it (Read) when the IPAM block
// names no range. Both sides find it with Path, so its place and format live
// only here.
package subnetfile

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// DefaultRunDir is where villaged publishes what it leased for each network;
// the RunDirEnv environment variable overrides it (tests, unusual layouts).
const (
	DefaultRunDir = "/run/village"
	RunDirEnv     = "VILLAGE_RUN_DIR"
	// Name is the file under <run dir>/<network>/ holding the leased pod
	// subnet(s), one CIDR per line, one range set each.
	Name = "subnet"
)

// RunDir is $VILLAGE_RUN_DIR or DefaultRunDir.
func RunDir() string {
	if d := os.Getenv(RunDirEnv); d != "" {
		return d
	}
	return DefaultRunDir
}

// Path is network's subnet file under runDir ("" means RunDir()). network
// must be a valid network name.
func Path(runDir, network string) string {
	if runDir == "" {
		runDir = RunDir()
	}
	return filepath.Join(runDir, network, Name)
}

// Read reads a subnet file: one CIDR per line; blank lines and lines
// starting with '#' are skipped.
func Read(path string) ([]netip.Prefix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, err := netip.ParsePrefix(line)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, i+1, err)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no subnet", path)
	}
	return out, nil
}

// Write puts subnets (after a comment line) into path atomically: a
// temporary file in the same directory, synced, renamed over, the directory
// synced; only when the content changes. It reports whether it wrote.
func Write(path, comment string, subnets []*net.IPNet) (changed bool, err error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n", comment)
	for _, n := range subnets {
		b.WriteString(n.String() + "\n")
	}
	want := b.String()
	if have, err := os.ReadFile(path); err == nil && string(have) == want {
		return false, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("publishing the leased subnet: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".subnet-*")
	if err != nil {
		return false, fmt.Errorf("publishing the leased subnet: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.WriteString(want); err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("publishing the leased subnet in %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("publishing the leased subnet: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return true, nil
}
