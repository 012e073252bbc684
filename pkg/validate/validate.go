// Package validate holds the naming and range rules every Village parser
// shares, so that a value one parser accepts the others accept too: Linux
// link names, interface MACs, MTUs, Kubernetes node and namespace names, CNI network names
// and container IDs, and log levels. Each rule returns an error that names the value and says
// what is wanted; callers add which field it came from. It imports the
// standard library only (it is linked into every plugin binary).
package validate

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
)

// MaxLinkName is the longest Linux link name in bytes (IFNAMSIZ-1).
const MaxLinkName = 15

// LinkName checks a Linux link name as the kernel's dev_valid_name does: 1 to
// 15 bytes, not "." or "..", no '/', ':' or whitespace (the kernel's
// isspace, which counts the byte 0xa0 too). It also refuses NUL
// and other control bytes: the kernel would cut the name at NUL ("eth0\x00x"
// would silently mean eth0), and a control byte in a name breaks the store's
// files and the logs that record it.
func LinkName(name string) error {
	if name == "" || len(name) > MaxLinkName {
		return fmt.Errorf("interface name %q: must be 1 to %d bytes long", name, MaxLinkName)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("interface name %q is not allowed", name)
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '/' || c == ':':
			return fmt.Errorf("interface name %q: must not contain %q", name, c)
		case c <= ' ' || c == 0x7f || c == 0xa0:
			return fmt.Errorf("interface name %q: must not contain whitespace or control characters", name)
		}
	}
	return nil
}

// MAC parses the MAC address of an interface: 6 bytes, unicast.
func MAC(s string) (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return nil, fmt.Errorf("MAC %q: want a 6-byte MAC like 0a:58:0a:f4:01:05", s)
	}
	if hw[0]&1 == 1 {
		return nil, fmt.Errorf("MAC %q: a multicast MAC cannot be an interface address", s)
	}
	return hw, nil
}

// The MTU range a config may ask for: IPv4's minimum (RFC 791) to the
// largest the kernel's netlink attribute carries for a bridge or veth.
const (
	MinMTU = 68
	MaxMTU = 65535
)

// MTU checks a configured MTU: 0 (automatic: the caller picks it) or
// MinMTU to MaxMTU.
func MTU(mtu int) error {
	if mtu != 0 && (mtu < MinMTU || mtu > MaxMTU) {
		return fmt.Errorf("MTU %d: must be 0 (automatic) or %d-%d", mtu, MinMTU, MaxMTU)
	}
	return nil
}

// MaxNodeName is the longest Kubernetes node name (a DNS-1123 subdomain).
const MaxNodeName = 253

// NodeName checks a node name as Kubernetes defines a Node's name: a
// DNS-1123 subdomain, 1 to 253 bytes of lower-case letters, digits, '-' and
// '.', in dot-separated labels that each start and end with a letter or
// digit. Such a name is also one safe etcd key component and file name.
func NodeName(name string) error {
	if name == "" || len(name) > MaxNodeName {
		return fmt.Errorf("node name %q: must be 1 to %d characters", name, MaxNodeName)
	}
	for _, label := range strings.Split(name, ".") {
		if !dns1123Label(label) {
			return fmt.Errorf("node name %q: must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit), as a Kubernetes Node name is", name)
		}
	}
	return nil
}

// PodName checks a Kubernetes pod name: a DNS-1123 subdomain, as a Node's.
func PodName(name string) error {
	if err := NodeName(name); err != nil {
		return fmt.Errorf("pod name %q: must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most %d)", name, MaxNodeName)
	}
	return nil
}

// NamespaceName checks a Kubernetes namespace name: a DNS-1123 label, 1 to
// 63 lower-case letters, digits and '-', starting and ending with a letter
// or digit.
func NamespaceName(name string) error {
	if len(name) > 63 || !dns1123Label(name) {
		return fmt.Errorf("namespace %q: must be a DNS-1123 label (lower-case letters, digits and '-', at most 63, starting and ending with a letter or digit)", name)
	}
	return nil
}

func dns1123Label(l string) bool {
	if l == "" || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// MaxNetworkName bounds a network name: it names a directory of the disk
// store and a component of etcd keys, and leaves room in a 255-byte file
// name for what is appended to it.
const MaxNetworkName = 200

// NetworkName checks a network name as the CNI spec defines it
// (^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$), at most MaxNetworkName bytes.
func NetworkName(name string) error { return cniIdentifier("network name", name, MaxNetworkName) }

// cniIdentifier checks s, a what, against the CNI spec's pattern for network
// names and container IDs, and against max bytes.
func cniIdentifier(what, s string, max int) error {
	if s == "" {
		return fmt.Errorf("missing %s", what)
	}
	if len(s) > max {
		return fmt.Errorf("%s %.20q...: longer than %d bytes", what, s, max)
	}
	if !cniName(s) {
		return fmt.Errorf("%s %q: must start with a letter or digit and contain only letters, digits, '_', '.' and '-'", what, s)
	}
	return nil
}

// MaxContainerID bounds a container ID (runtimes use 64 hex digits).
const MaxContainerID = 1024

// ContainerID checks a container ID as the CNI spec defines it (the network
// name's pattern), at most MaxContainerID bytes.
func ContainerID(id string) error { return cniIdentifier("container ID", id, MaxContainerID) }

// cniName reports whether s matches the CNI spec's name and container ID
// pattern ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$.
func cniName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i > 0 {
			ok = ok || c == '_' || c == '.' || c == '-'
		}
		if !ok {
			return false
		}
	}
	return s != ""
}

// LogLevel maps a "logLevel" value to a slog level: debug, info, warn (or
// warning) and error, in any case; "" is info.
func LogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return slog.LevelInfo, fmt.Errorf("logLevel %q: one of debug, info, warn (or warning), error", s)
}
