package netsetup

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The bridge's own nf_call_iptables / nf_call_ip6tables options send the
// IPv4 and IPv6 frames it forwards between its ports through netfilter even
// when the namespace's net.bridge.bridge-nf-call-* sysctls are 0. Without
// them a pod reaching a Service (a DNAT in nat PREROUTING, as kube-proxy
// writes) whose endpoint is on the same bridge gets a reply bridged straight
// back and never un-DNATed. vishvananda/netlink neither parses nor sets these
// attributes, so this file reads them off the same RTM_GETLINK reply that
// gives the link and sets them with one RTM_NEWLINK.

// bridgeLink is a link looked up by name together with the bridge's
// netfilter options (false when the link is not a bridge).
type bridgeLink struct {
	link netlink.Link
	nfOn bool // nf_call_iptables and nf_call_ip6tables are both 1
}

// lookupBridge is netlink.LinkByName for one name, one round trip, that
// also reports the bridge's nf_call options, so the 2nd and later ADDs learn
// that the bridge already fits without asking the kernel again.
func lookupBridge(name string) (bridgeLink, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(nl.RTEXT_FILTER_VF)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, 0)
	if errors.Is(err, unix.ENODEV) || (err == nil && len(msgs) == 0) {
		return bridgeLink{}, netlink.LinkNotFoundError{}
	}
	if err != nil {
		return bridgeLink{}, err
	}
	if len(msgs) != 1 {
		return bridgeLink{}, fmt.Errorf("%d links answer to the name %q", len(msgs), name)
	}
	l, err := netlink.LinkDeserialize(nil, msgs[0])
	if err != nil {
		return bridgeLink{}, err
	}
	return bridgeLink{link: l, nfOn: nfCallsOn(msgs[0])}, nil
}

// nfCallsOn reads IFLA_LINKINFO / IFLA_INFO_DATA of an RTM_NEWLINK message
// and reports whether both bridge nf_call options are set.
func nfCallsOn(m []byte) bool {
	info := nl.DeserializeIfInfomsg(m)
	data := attrValue(attrValue(m[info.Len():], unix.IFLA_LINKINFO), nl.IFLA_INFO_DATA)
	on := func(typ uint16) bool {
		v := attrValue(data, typ)
		return len(v) > 0 && v[0] == 1
	}
	return on(unix.IFLA_BR_NF_CALL_IPTABLES) && on(unix.IFLA_BR_NF_CALL_IP6TABLES)
}

// attrValue is the value of the first attribute of type typ in b (nil
// when there is none or b does not parse).
func attrValue(b []byte, typ uint16) []byte {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil
	}
	for _, a := range attrs {
		if a.Attr.Type == typ {
			return a.Value
		}
	}
	return nil
}

// setBridgeNfCalls turns on the bridge's nf_call_iptables and
// nf_call_ip6tables options.
func setBridgeNfCalls(br *netlink.Bridge) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(br.Index)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("bridge"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(unix.IFLA_BR_NF_CALL_IPTABLES, []byte{1})
	data.AddRtAttr(unix.IFLA_BR_NF_CALL_IP6TABLES, []byte{1})
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("failed to set nf_call_iptables and nf_call_ip6tables on bridge %q: %w", br.Name, err)
	}
	return nil
}

// BridgeNetfilterPath is the sysctl directory br_netfilter registers in
// every network namespace when it is loaded.
const BridgeNetfilterPath = "/proc/sys/net/bridge"

// BridgeNetfilterLoaded reports whether br_netfilter is loaded, as seen
// from the calling thread's network namespace: without the module, bridged
// traffic never reaches netfilter whatever the bridge's own options say,
// and a pod reaching a Service whose endpoint shares its bridge times out.
// The error explains what is missing and how to load it.
func BridgeNetfilterLoaded() error {
	return BridgeNetfilterLoadedAt(BridgeNetfilterPath)
}

// BridgeNetfilterLoadedAt is BridgeNetfilterLoaded with the sysctl
// directory given (tests point it at a directory that is missing).
func BridgeNetfilterLoadedAt(dir string) error {
	_, err := os.Stat(dir)
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("br_netfilter is not loaded (" + dir + " is missing): bridged pod traffic bypasses iptables/nftables, so a Service whose endpoint is on the same node is unreachable; run `modprobe br_netfilter` on the host (and list it in /etc/modules-load.d)")
	}
	return fmt.Errorf("failed to check for br_netfilter (%s): %w", dir, err)
}
