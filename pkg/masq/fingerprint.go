package masq

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fingerprint is a short string that changes whenever a rule set the
// backend's rules live in may have changed, read in microseconds without
// exec: the nf_tables generation ID of the current network namespace (it
// moves with every nf_tables transaction, including iptables-nft's), and
// for the iptables backend also the entry count and size of the legacy
// nat and filter tables (x_tables has no generation counter; a flush or a
// restore changes the count or the size).
//
// On a legacy host the iptables backend's rules all live in x_tables, so
// the nf_tables generation is left out (nftables rules of others, e.g.
// macspoofchk's, do not make it look again).
func Fingerprint(backend string) string {
	if backend != IPTables {
		return "g" + genString()
	}
	if Detect().Legacy {
		return "l" + legacyString()
	}
	return "g" + genString() + "l" + legacyString()
}

func genString() string {
	id, err := GenID()
	if err != nil {
		return "-"
	}
	return fmt.Sprintf("%x", id)
}

// GenID asks nf_tables for its ruleset generation ID (NFT_MSG_GETGEN).
func GenID() (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("failed to open a netfilter netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("failed to bind a netfilter netlink socket: %w", err)
	}
	// nlmsghdr (16) + nfgenmsg (4): family AF_UNSPEC, version 0, res_id 0.
	req := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN))
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], 1)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("failed to ask nf_tables for its generation: %w", err)
	}
	buf := make([]byte, 512)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("failed to read nf_tables' generation: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("failed to parse nf_tables' generation: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR {
			if len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
					return 0, fmt.Errorf("nf_tables generation: %w", unix.Errno(-code))
				}
			}
			continue
		}
		attrs := m.Data
		if len(attrs) < 4 {
			continue
		}
		attrs = attrs[4:]
		for len(attrs) >= 4 {
			l := int(binary.NativeEndian.Uint16(attrs[0:]))
			typ := binary.NativeEndian.Uint16(attrs[2:]) & 0x3fff
			if l < 4 || l > len(attrs) {
				break
			}
			if typ == unix.NFTA_GEN_ID && l >= 8 {
				return binary.BigEndian.Uint32(attrs[4:8]), nil
			}
			attrs = attrs[(l+3)&^3:]
		}
	}
	return 0, fmt.Errorf("nf_tables answered without a generation ID")
}

// legacyString is entries/size of the legacy nat and filter tables of both
// families, "-" for a table that does not exist. Only tables listed in
// /proc/thread-self/net/ip{,6}_tables_names are asked about: asking for a missing one
// would make the kernel load its module (and create it).
func legacyString() string {
	var b strings.Builder
	for _, f := range []struct {
		names       string
		family, opt int
		level       int
	}{
		{"/proc/thread-self/net/ip_tables_names", unix.AF_INET, 0x40, unix.SOL_IP},     // IPT_SO_GET_INFO
		{"/proc/thread-self/net/ip6_tables_names", unix.AF_INET6, 0x40, unix.SOL_IPV6}, // IP6T_SO_GET_INFO
	} {
		data, _ := os.ReadFile(f.names)
		have := strings.Fields(string(data))
		for _, t := range []string{natTable, filterTable} {
			if !contains(have, t) {
				b.WriteString("-")
				continue
			}
			entries, size, err := legacyInfo(f.family, f.level, f.opt, t)
			if err != nil {
				b.WriteString("?")
				continue
			}
			fmt.Fprintf(&b, "%x.%x.", entries, size)
		}
	}
	return b.String()
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// legacyInfo reads struct ipt_getinfo / ip6t_getinfo (same layout): name
// [32], valid_hooks, hook_entry[5], underflow[5], num_entries, size.
func legacyInfo(family, level, opt int, table string) (uint32, uint32, error) {
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	var info [84]byte
	copy(info[:32], table)
	l := uint32(len(info))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return 0, 0, e
	}
	return binary.NativeEndian.Uint32(info[76:]), binary.NativeEndian.Uint32(info[80:]), nil
}
