package kubecluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Reboot power-cycles the node: every process of it is killed (stop: no
// graceful shutdown, no CNI DEL), what a reboot loses is lost (its /run,
// and its kernel network state: every link but lo and the LAN's eth0, with
// their routes; the nftables and iptables rules; forwarding), its disk is
// kept (/etc/cni with the conflist, /var/lib with containerd's images and
// kubelet's state, /opt/cni/bin), and it starts again. It returns once
// kubelet runs; the Node's Ready condition is the caller's to wait for.
func (n *Node) Reboot() error {
	n.stop()
	if err := os.RemoveAll(filepath.Join(n.dir, "fs", "run")); err != nil {
		return fmt.Errorf("node %s: emptying /run: %w", n.Name, err)
	}
	netns := filepath.Base(n.NetNS.Path())
	if out, err := exec.Command("ip", "netns", "exec", netns, "sh", "-c", wipeNetwork).CombinedOutput(); err != nil {
		return fmt.Errorf("node %s: wiping the kernel's network state: %w: %s", n.Name, err, out)
	}
	out, err := exec.Command("ip", "-n", netns, "-o", "link", "show").CombinedOutput()
	if err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 1 {
		return fmt.Errorf("node %s: links left after the wipe (want lo and eth0): %v\n%s", n.Name, err, out)
	}
	// start waits for the new supervisor's mark
	if err := os.Remove(filepath.Join(n.dir, "mounted")); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	n.mu.Lock()
	n.stopped = false
	n.mu.Unlock()
	return n.start()
}

// wipeNetwork, run in the node's network namespace, leaves what a booted
// machine has before any of its services ran: lo and the LAN link (with
// the address and routes its OS gives it), no other link, no netfilter
// rule (nftables, and iptables' legacy backend where this machine's
// iptables uses it), forwarding off.
const wipeNetwork = `set -e
for l in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
	case $l in lo|eth0) ;; *) ip link del "$l" 2>/dev/null || true ;; esac
done
nft flush ruleset
for t in iptables-legacy ip6tables-legacy; do
	command -v $t >/dev/null || continue
	for tb in filter nat mangle raw; do $t -t $tb -F 2>/dev/null || true; $t -t $tb -X 2>/dev/null || true; done
done
echo 0 > /proc/sys/net/ipv4/ip_forward
echo 0 > /proc/sys/net/ipv6/conf/all/forwarding
`
