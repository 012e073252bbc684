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
	"strings"

	"github.com/village-cni/village/pkg/nodelocal"
)

// Path is network's subnet file under runDir ("" means the run directory,
// nodelocal.RunDir). network must be a valid network name.
func Path(runDir, network string) string { return nodelocal.SubnetFile(runDir, network) }

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

// Write puts subnets (after a comment line) into path atomically
// (nodelocal.WriteFile), only when the content changes. It reports whether it wrote.
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
	if err := nodelocal.WriteFile(path, []byte(want), 0o644); err != nil {
		return false, fmt.Errorf("publishing the leased subnet: %w", err)
	}
	return true, nil
}
