package agent

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// podAddrs are the addresses found behind host veths.
type podAddrs struct {
	byIP   map[string]string   // pod address -> host veth
	byVeth map[string][]string // host veth -> pod addresses
}

func (p podAddrs) of(veth string) []string { return p.byVeth[veth] }

// addrsBehind finds the addresses of the pod ends of ports (host veths in
// this namespace) by looking into every network namespace of the machine
// that a process holds or /run/netns names. The pod end of a port is in the
// namespace whose id (as this namespace numbers it) is the port's link
// netns id, and is the veth there whose peer index is the port's index and
// whose index is the port's peer index (indexes alone repeat across
// namespaces). Namespaces that cannot be opened are skipped; this namespace
// is not looked at.
func addrsBehind(ports []netlink.Link) podAddrs {
	out := podAddrs{byIP: map[string]string{}, byVeth: map[string][]string{}}
	if len(ports) == 0 {
		return out
	}
	seen := map[[2]uint64]bool{}
	if k, ok := nsKey("/proc/self/ns/net"); ok {
		seen[k] = true
	}
	paths, _ := filepath.Glob("/run/netns/*")
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, path := range append(paths, procs...) {
		k, ok := nsKey(path)
		if !ok || seen[k] {
			continue
		}
		seen[k] = true
		lookIn(path, ports, out)
	}
	for _, addrs := range out.byVeth {
		slices.Sort(addrs)
	}
	return out
}

// nsKey identifies a namespace file by device and inode.
func nsKey(path string) ([2]uint64, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return [2]uint64{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return [2]uint64{}, false
	}
	return [2]uint64{uint64(st.Dev), st.Ino}, true
}

func lookIn(path string, ports []netlink.Link, out podAddrs) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return
	}
	defer h.Close()
	id, err := netlink.GetNetNsIdByFd(int(h))
	if err != nil || id < 0 {
		return // this namespace has no id for it: no veth of ours leads there
	}
	ports = slices.DeleteFunc(slices.Clone(ports), func(p netlink.Link) bool { return p.Attrs().NetNsID != id })
	if len(ports) == 0 {
		return
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return
	}
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		return
	}
	for _, l := range links {
		if l.Type() != "veth" {
			continue
		}
		for _, p := range ports {
			if l.Attrs().ParentIndex != p.Attrs().Index || p.Attrs().ParentIndex != l.Attrs().Index {
				continue
			}
			addrs, err := nl.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if a.IP.IsLinkLocalUnicast() {
					continue
				}
				out.byIP[a.IP.String()] = p.Attrs().Name
				out.byVeth[p.Attrs().Name] = append(out.byVeth[p.Attrs().Name], a.IP.String())
			}
		}
	}
}
