// Command village-xtables is `iptables` (and ip6tables, iptables-save, ...)
// inside Village's DaemonSet image. The agent runs there with the node's
// network but not the node's files, so the image cannot know which iptables
// variant the node uses; this picks it per call with the same rule the agent
// itself uses to choose its masquerade backend (masq.Detect: a binary whose
// name says neither nft nor legacy is judged by the namespace, legacy when
// legacy tables exist there), then execs the matching multi-call binary under
// the name it was called by. So the agent, its iptables calls and the plugin
// on a legacy node all land in the same tables.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/village-cni/village/pkg/masq"
)

const (
	nftMulti    = "/usr/sbin/xtables-nft-multi"
	legacyMulti = "/usr/sbin/xtables-legacy-multi"
)

func main() {
	multi := nftMulti
	if masq.Detect().Legacy {
		multi = legacyMulti
	}
	args := append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...)
	err := syscall.Exec(multi, args, os.Environ())
	fmt.Fprintf(os.Stderr, "village-xtables: exec %s: %v\n", multi, err)
	os.Exit(127)
}
