package netsetup

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultRouteLink returns the interface of the main table's default route,
// IPv4 first, then IPv6 (for a multipath route, its first next hop), and
// that route's family, through h (nil: the current namespace). It returns a
// nil link and no error when there is no default route. Village uses it
// wherever "the node's LAN/underlay interface" is left unnamed: the
// overlay's underlay, the macvlan master, villaged and the install template.
func DefaultRouteLink(h *netlink.Handle) (netlink.Link, int, error) {
	if h == nil {
		h = &netlink.Handle{} // what the package-level functions use
	}
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var routes []netlink.Route
		var err error
		for range 5 {
			if routes, err = h.RouteListFiltered(family, filter, netlink.RT_FILTER_TABLE); !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return nil, 0, fmt.Errorf("listing routes to find the default route's interface: %w", err)
		}
		for _, rt := range routes {
			if rt.Dst != nil {
				if ones, _ := rt.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			index := rt.LinkIndex
			if index == 0 && len(rt.MultiPath) > 0 {
				index = rt.MultiPath[0].LinkIndex
			}
			if index == 0 {
				continue
			}
			link, err := h.LinkByIndex(index)
			if err != nil {
				return nil, 0, fmt.Errorf("default route interface %d: %w", index, err)
			}
			return link, family, nil
		}
	}
	return nil, 0, nil
}
