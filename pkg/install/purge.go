package install

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/village-cni/village/pkg/macvlan"
	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/overlay"
)

// Purge removes, in the caller's network namespace, the node objects Village
// owns for the given networks:
//
//   - the bridges the conflist named (their veth ports go with them),
//   - every macvlan named vshim-* (host shims) and every VXLAN device named
//     village.<vni>, recorded or not,
//   - every route of protocol 86 (overlay peers) and 87 (host shims), in any
//     table and family,
//   - each network's netfilter rules in both backends: masquerade chains or
//     table, forward accept rules (masq.Teardown).
//
// Objects already gone are fine; a second Purge changes nothing. Errors are
// collected and returned together, each naming its object.
func Purge(networks []NetworkRecord) ([]Change, error) {
	var (
		changes []Change
		errs    []error
	)
	note := func(a Action, obj, n string) { changes = append(changes, Change{Action: a, Path: obj, Note: n}) }

	// Routes first: most go with their links, host-gw routes via the
	// underlay do not.
	for _, proto := range []netlink.RouteProtocol{overlay.RouteProtocol, macvlan.RouteProtocol} {
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL,
			&netlink.Route{Protocol: proto, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes of protocol %d: %w", proto, err))
			continue
		}
		for _, rt := range routes {
			desc := fmt.Sprintf("route %s proto %d", routeDst(rt), proto)
			if err := netlink.RouteDel(&rt); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("delete %s: %w", desc, err))
				continue
			}
			note(Removed, desc, "")
		}
	}

	links, err := netlinksafe.LinkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	owned := map[string]string{} // name -> why it is Village's
	for _, n := range networks {
		for _, b := range n.Bridges {
			owned[b] = "bridge of network " + n.Name
		}
		for _, v := range n.VXLAN {
			owned[v] = "VXLAN device of network " + n.Name
		}
		for _, s := range n.Shims {
			owned[s] = "host shim of network " + n.Name
		}
	}
	for _, l := range links {
		name := l.Attrs().Name
		why, ok := owned[name]
		switch {
		case ok:
			if want := expectedType(name, networks); want != "" && l.Type() != want {
				errs = append(errs, fmt.Errorf("link %s is a %s, not the %s Village made; left alone", name, l.Type(), want))
				continue
			}
		case l.Type() == "macvlan" && strings.HasPrefix(name, "vshim-"):
			why = "host shim"
		case l.Type() == "vxlan" && strings.HasPrefix(name, overlay.DevicePrefix):
			why = "VXLAN device"
		default:
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("delete link %s (%s): %w", name, why, err))
			continue
		}
		note(Removed, "link "+name, why)
		delete(owned, name)
	}
	for name := range owned {
		note(Absent, "link "+name, owned[name])
	}

	for _, n := range networks {
		if n.Name == "" {
			continue
		}
		had := masq.Present(n.Name)
		if err := masq.Teardown(n.Name); err != nil {
			errs = append(errs, fmt.Errorf("netfilter rules of network %s (%s): %w", n.Name, strings.Join(had, ", "), err))
			continue
		}
		if len(had) == 0 {
			note(Absent, "masquerade chain "+masq.Chain(n.Name), "network "+n.Name)
		}
		for _, h := range had {
			note(Removed, h, "network "+n.Name)
		}
	}
	return changes, errors.Join(errs...)
}

// chainExists reports whether the nat chain is there in either family;
// when iptables cannot tell, it says yes (Teardown then does the work and
// reports its own errors).
// expectedType is the link type Village makes under a recorded name.
func expectedType(name string, networks []NetworkRecord) string {
	for _, n := range networks {
		for _, b := range n.Bridges {
			if b == name {
				return "bridge"
			}
		}
		for _, v := range n.VXLAN {
			if v == name {
				return "vxlan"
			}
		}
		for _, s := range n.Shims {
			if s == name {
				return "macvlan"
			}
		}
	}
	return ""
}

func routeDst(rt netlink.Route) string {
	if rt.Dst == nil {
		return "default"
	}
	return rt.Dst.String()
}

func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV)
}
