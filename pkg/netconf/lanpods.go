package netconf

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// Values of "macvlan.pods".
const (
	// PodsAll gives every pod of the network the LAN interface (the
	// default: configs written before the key existed, runtimes without
	// Kubernetes).
	PodsAll = "all"
	// PodsAnnotated gives it only to pods that ask: in Kubernetes through
	// the pod's annotations (which the plugin learns from the node's agent),
	// elsewhere through CNI_ARGS VILLAGE_LAN / VILLAGE_LAN_IP.
	PodsAnnotated = "annotated"
)

// MaxLANAddrs is how many addresses a pod may ask for on the LAN: one per
// family.
const MaxLANAddrs = 2

func (c *LAN) parsePods() error {
	switch c.Pods {
	case "":
		c.Pods = PodsAll
	case PodsAll, PodsAnnotated:
	default:
		return invalidLAN("\"pods\" %q: one of %q (every pod, the default) or %q (only pods that ask)", c.Pods, PodsAll, PodsAnnotated)
	}
	return nil
}

// LANRequest is what one pod asks of the LAN: an interface (Want), and
// optionally exactly these addresses (which imply Want).
type LANRequest struct {
	Want bool
	IPs  []netip.Addr
}

// ParseLANAddrs reads a requested LAN address list, the value of the
// village.cni.io/lan-ip annotation and of CNI_ARGS VILLAGE_LAN_IP: one
// address, or two of different families separated by a comma (dual
// stack). Zones, the unspecified, loopback and multicast addresses are
// refused.
func ParseLANAddrs(s string) ([]netip.Addr, error) {
	parts := strings.Split(s, ",")
	if len(parts) > MaxLANAddrs {
		return nil, fmt.Errorf("%q: at most %d addresses, one IPv4 and one IPv6", s, MaxLANAddrs)
	}
	var out []netip.Addr
	for _, p := range parts {
		p = strings.TrimSpace(p)
		a, err := netip.ParseAddr(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address", p)
		}
		if a.Zone() != "" {
			return nil, fmt.Errorf("%q has an IPv6 zone; zones are not allowed", p)
		}
		a = a.Unmap()
		if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() {
			return nil, fmt.Errorf("%q cannot be a pod's LAN address", p)
		}
		for _, o := range out {
			if o.Is4() == a.Is4() {
				return nil, fmt.Errorf("%q: two addresses of the same family (%s, %s); give at most one IPv4 and one IPv6", s, o, a)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// CheckAddrs says whether the LAN pool can hand out exactly ips: each must
// be an allocatable address of one of the IPAM block's range sets (not the
// gateway, network or broadcast address). A block with no ranges of its
// own (another plugin's) is not checked here; its IPAM plugin decides.
func (c *LAN) CheckAddrs(ips []netip.Addr) error {
	if len(c.Sets) == 0 {
		return nil
	}
	for _, a := range ips {
		if !c.inPool(a) {
			return fmt.Errorf("LAN address %s is outside the LAN pool (%s)", a, c.poolString())
		}
	}
	return nil
}

func (c *LAN) inPool(a netip.Addr) bool {
	for _, set := range c.Sets {
		for _, r := range set {
			if r.Allocatable(a) {
				return true
			}
		}
	}
	return false
}

func (c *LAN) poolString() string {
	var s []string
	for _, set := range c.Sets {
		for _, r := range set {
			s = append(s, r.String())
		}
	}
	return strings.Join(s, ", ")
}

// lanArgs reads the LAN request of CNI_ARGS: VILLAGE_LAN=true|false and
// VILLAGE_LAN_IP=<addr>[,<addr>] (which implies VILLAGE_LAN=true). set
// reports whether either key was there.
func lanArgs(e *EnvArgs) (req LANRequest, set bool, err *types.Error) {
	bad := func(key string, e error) *types.Error {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_ARGS %s: %v", key, e), "")
	}
	if v := string(e.VILLAGE_LAN); v != "" {
		b, perr := strconv.ParseBool(v)
		if perr != nil {
			return req, false, bad("VILLAGE_LAN", fmt.Errorf("%q: want true or false", v))
		}
		req.Want, set = b, true
	}
	if v := string(e.VILLAGE_LAN_IP); v != "" {
		ips, perr := ParseLANAddrs(v)
		if perr != nil {
			return req, false, bad("VILLAGE_LAN_IP", perr)
		}
		if set && !req.Want {
			return req, false, bad("VILLAGE_LAN_IP", fmt.Errorf("set together with VILLAGE_LAN=false"))
		}
		req.Want, req.IPs, set = true, ips, true
	}
	return req, set, nil
}
