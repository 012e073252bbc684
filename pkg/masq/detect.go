package masq

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Host is what the node offers, found without running anything.
type Host struct {
	// IPTables is the resolved path of the `iptables` binary ("" if none).
	IPTables string
	// Legacy is true when that binary is the legacy (x_tables) variant.
	Legacy bool
}

// Detect finds the iptables binary on PATH and its variant from the name
// it resolves to (Debian's alternatives and the upstream multi-call
// binaries name it: iptables-legacy, xtables-legacy-multi, iptables-nft,
// xtables-nft-multi; xtables-multi is the legacy one of iptables < 1.8).
// A name that says neither (a wrapper script, a plain binary) is judged by
// the namespace: legacy when it already has legacy tables, where a legacy
// FORWARD drop would live.
func Detect() Host {
	p, err := exec.LookPath("iptables")
	if err != nil {
		return Host{}
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return Host{}
	}
	base := filepath.Base(real)
	h := Host{IPTables: real}
	switch {
	case strings.Contains(base, "nft"):
	case strings.Contains(base, "legacy"), base == "xtables-multi":
		h.Legacy = true
	default:
		h.Legacy = legacyTablesExist()
	}
	return h
}

func legacyTablesExist() bool {
	for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
		if b, err := os.ReadFile(f); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return true
		}
	}
	return false
}

// Resolve returns the backend to use: the configured one, or when none is
// configured iptables on legacy hosts and nftables everywhere else.
func Resolve(configured string) string {
	if configured != "" {
		return configured
	}
	if h := Detect(); h.IPTables != "" && h.Legacy {
		return IPTables
	}
	return NFTables
}
