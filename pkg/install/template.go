package install

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/village-cni/village/pkg/netsetup"
	"github.com/village-cni/village/pkg/nodelocal"
)

// DefaultTemplate is the conflist written when no template is given: a
// single-node village + village-ipam network chained with portmap and
// bandwidth, the same
// shape as conf/10-village.conflist, with the node's pod subnet and the
// cluster CIDR as variables.
//
//go:embed default.conflist.tmpl
var DefaultTemplate []byte

// placeholder matches ${NAME} and ${NAME:-default}.
var placeholder = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// Render substitutes every ${NAME} (or ${NAME:-default}) in tmpl with
// lookup(NAME). Values are escaped for a JSON string, so a value can never
// break out of the string it is placed in. A name with no value and no
// default is an error naming every such variable: a conflist with a hole in
// it must not reach a runtime.
func Render(tmpl []byte, lookup func(string) (string, bool)) ([]byte, error) {
	var missing []string
	out := placeholder.ReplaceAllFunc(tmpl, func(m []byte) []byte {
		sub := placeholder.FindSubmatch(m)
		name := string(sub[1])
		v, ok := lookup(name)
		if !ok || v == "" {
			if len(sub[2]) == 0 {
				if !ok {
					missing = append(missing, name)
				}
				return nil
			}
			v = string(sub[3])
		}
		return jsonEscape(v)
	})
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("template variables without a value: %s (set them with --set NAME=VALUE or in the environment, or give a default as ${NAME:-value})", strings.Join(dedup(missing), ", "))
	}
	return out, nil
}

func jsonEscape(s string) []byte {
	b, _ := json.Marshal(s)
	return b[1 : len(b)-1]
}

func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// NodeVars are the values Village knows about the node without being told:
// NODE_NAME (the host name in lower case, nodelocal.HostNodeName), DEFAULT_IFACE (the interface of the IPv4, else
// IPv6, default route) and NODE_IP (that interface's first global address).
// What cannot be found is left out, so a template that needs it fails
// unless it has a default.
func NodeVars() map[string]string {
	vars := map[string]string{}
	if h, err := nodelocal.HostNodeName(); err == nil && h != "" {
		vars["NODE_NAME"] = h
	}
	if iface, ip := defaultRoute(); iface != "" {
		vars["DEFAULT_IFACE"] = iface
		if ip != "" {
			vars["NODE_IP"] = ip
		}
	}
	return vars
}

func defaultRoute() (iface, ip string) {
	link, family, err := netsetup.DefaultRouteLink(nil)
	if err != nil || link == nil {
		return "", ""
	}
	addrs, _ := netlink.AddrList(link, family)
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			return link.Attrs().Name, a.IP.String()
		}
	}
	return link.Attrs().Name, ""
}
