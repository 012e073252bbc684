package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// vtepSpec is the VXLAN device this node should have.
type vtepSpec struct {
	name     string
	vni      int
	port     int
	local    net.IP
	underlay int // link index the device is bound to
	mtu      int
	mac      net.HardwareAddr
	alias    string       // Alias(network): whose device it is
	addrs    []*net.IPNet // the VTEP addresses: network address of each own pod subnet
}

// vtepSpecFor is the device for this underlay and node. Its MTU, the
// underlay's less the VXLAN overhead, is decided here only; the Report
// carries it to netconf.NetConf.PodMTU.
func (r *Reconciler) vtepSpecFor(u underlay, self Node) vtepSpec {
	s := vtepSpec{
		name:     r.Device(),
		vni:      r.cfg.VNI,
		port:     r.cfg.Port,
		local:    u.ip,
		underlay: u.link.Attrs().Index,
		mtu:      u.mtu() - Overhead(u.ip),
		mac:      self.VtepMAC,
		alias:    r.alias(),
	}
	if s.mac == nil {
		s.mac = DeriveMAC(u.ip)
	}
	for _, c := range self.PodCIDRs {
		s.addrs = append(s.addrs, vtepAddr(canonical(c)))
	}
	return s
}

// PodMTU is the MTU for a pod added now, read without writing anything or
// knowing the peers (the plugin's ADD when villaged owns them): 0 for none;
// the underlay's for host-gw; the VXLAN device's (the underlay's less
// Overhead) for vxlan; for auto the device's while this network's device
// exists, that is while the last pass reached at least one peer over VXLAN
// (needsDevice), else the underlay's. A pod keeps its MTU: one added under
// auto while every peer was on the underlay's subnet has the underlay MTU,
// and its packets to an off-link peer that joins later are larger than the
// device's; the node answers those with ICMP "fragmentation needed" /
// "packet too big" (TCP and DF traffic adapt, IPv4 without DF is
// fragmented). A device of another network is an error wrapping
// ErrConflict.
func (r *Reconciler) PodMTU(self Node) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return 0, errClosed
	}
	if r.cfg.Mode == ModeNone {
		return 0, nil
	}
	u, err := r.resolveUnderlay(self)
	if err != nil {
		return 0, err
	}
	if r.cfg.Mode == ModeHostGW {
		return u.mtu(), nil
	}
	if r.cfg.Mode == ModeWireGuard {
		return u.mtu() - WireGuardOverhead(u.ip), nil
	}
	link, mine, err := r.ownVTEP()
	if err != nil {
		return 0, err
	}
	if r.cfg.Mode == ModeAuto && (link == nil || !mine) {
		return u.mtu(), nil
	}
	return r.vtepSpecFor(u, self).mtu, nil
}

func (s vtepSpec) object() Object {
	return Object{Kind: KindDevice, Desc: fmt.Sprintf("%s (vxlan id %d local %s dstport %d nolearning mtu %d address %s)",
		s.name, s.vni, s.local, s.port, s.mtu, s.mac)}
}

// fits reports whether an existing link has the attributes that cannot be
// changed in place (otherwise it is recreated).
func (s vtepSpec) fits(l netlink.Link) bool {
	v, ok := l.(*netlink.Vxlan)
	return ok && v.VxlanId == s.vni && v.Port == s.port && v.SrcAddr.Equal(s.local) &&
		!v.Learning && v.VtepDevIndex == s.underlay && !v.FlowBased && len(v.Group) == 0
}

// settled reports whether l is the device as ensureVTEP leaves it: it
// fits, and fixVTEPLink has nothing to correct.
func (s vtepSpec) settled(l netlink.Link) bool {
	return s.fits(l) && len(s.linkFixes(l)) == 0
}

// hasAddr reports whether a is one of the VTEP addresses (fixVTEPAddrs
// adds those and removes the device's other global ones).
func (s vtepSpec) hasAddr(a *net.IPNet) bool {
	return slices.ContainsFunc(s.addrs, func(want *net.IPNet) bool { return want.String() == a.String() })
}

func (s vtepSpec) link() *netlink.Vxlan {
	return &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: s.name, MTU: s.mtu, HardwareAddr: s.mac},
		VxlanId:      s.vni,
		VtepDevIndex: s.underlay,
		SrcAddr:      s.local,
		Port:         s.port,
		Learning:     false,
	}
}

// ensureVTEP makes the VXLAN device match s, fixing only what differs, and
// returns it (index 0 when dry and the device is missing).
func (r *Reconciler) ensureVTEP(rc *recorder, s vtepSpec) linkRef {
	ref := linkRef{name: s.name}
	link, err := r.h.LinkByName(s.name)
	if err != nil && !linkNotFound(err) {
		_ = rc.fail(Change{OpAdd, s.object()}, fmt.Errorf("looking up device %s: %w", s.name, err))
		return ref
	}
	if link == nil || !s.fits(link) {
		link = r.createVTEP(rc, s, link)
		if link == nil {
			return ref
		}
	}
	ref.index = link.Attrs().Index
	r.fixVTEPLink(rc, s, link)
	r.fixVTEPAddrs(rc, s, link)
	return ref
}

// createVTEP adds the device, first removing old when it is in the way.
func (r *Reconciler) createVTEP(rc *recorder, s vtepSpec, old netlink.Link) netlink.Link {
	op := OpAdd
	if old != nil {
		op = OpReplace
	}
	var link netlink.Link
	_ = rc.do(Change{op, s.object()}, func() error {
		if old != nil {
			if err := r.h.LinkDel(old); err != nil && !gone(err) {
				return fmt.Errorf("removing the old device: %w", err)
			}
		}
		if err := r.h.LinkAdd(s.link()); err != nil {
			return err
		}
		var err error
		link, err = r.h.LinkByName(s.name)
		return err
	})
	return link
}

// linkFix is one in-place correction of the device: what it changes, and
// the write that does it.
type linkFix struct {
	desc string
	do   func(h *netlink.Handle, l netlink.Link) error
}

// linkFixes lists what fixVTEPLink would correct on l: MTU, MAC, alias and
// state, in that order. settled asks it too, so the two cannot disagree.
func (s vtepSpec) linkFixes(l netlink.Link) []linkFix {
	a := l.Attrs()
	var fixes []linkFix
	if a.MTU != s.mtu {
		fixes = append(fixes, linkFix{fmt.Sprintf("%s mtu %d (was %d)", s.name, s.mtu, a.MTU),
			func(h *netlink.Handle, l netlink.Link) error { return h.LinkSetMTU(l, s.mtu) }})
	}
	if !bytes.Equal(a.HardwareAddr, s.mac) {
		fixes = append(fixes, linkFix{fmt.Sprintf("%s address %s (was %s)", s.name, s.mac, a.HardwareAddr),
			func(h *netlink.Handle, l netlink.Link) error { return h.LinkSetHardwareAddr(l, s.mac) }})
	}
	if a.Alias != s.alias {
		// A new device (the kernel takes no alias at creation) or one made
		// before devices had one: ownVTEP refused another network's.
		fixes = append(fixes, linkFix{fmt.Sprintf("%s alias %q (was %q)", s.name, s.alias, a.Alias),
			func(h *netlink.Handle, l netlink.Link) error { return h.LinkSetAlias(l, s.alias) }})
	}
	if a.Flags&net.FlagUp == 0 {
		fixes = append(fixes, linkFix{s.name + " up",
			func(h *netlink.Handle, l netlink.Link) error { return h.LinkSetUp(l) }})
	}
	return fixes
}

// fixVTEPLink corrects MTU, MAC, alias and state in place.
func (r *Reconciler) fixVTEPLink(rc *recorder, s vtepSpec, link netlink.Link) {
	for _, f := range s.linkFixes(link) {
		c := Change{OpReplace, Object{Kind: KindDevice, Desc: f.desc}}
		_ = rc.do(c, func() error { return f.do(r.h, link) })
	}
}

// fixVTEPAddrs adds the missing VTEP addresses and removes other global ones.
func (r *Reconciler) fixVTEPAddrs(rc *recorder, s vtepSpec, link netlink.Link) {
	have, err := r.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		_ = rc.fail(Change{OpAdd, Object{Kind: KindAddress, Desc: "dev " + s.name}}, fmt.Errorf("listing addresses of %s: %w", s.name, err))
		return
	}
	present := map[string]bool{}
	for _, a := range have {
		present[a.IPNet.String()] = true
	}
	wanted := map[string]bool{}
	for _, want := range s.addrs {
		wanted[want.String()] = true
		if present[want.String()] {
			continue
		}
		addr := &netlink.Addr{IPNet: want}
		if !isV4(want.IP) {
			addr.Flags = unix.IFA_F_NODAD
		}
		c := Change{OpAdd, Object{Kind: KindAddress, Desc: want.String() + " dev " + s.name}}
		_ = rc.do(c, func() error { return r.h.AddrAdd(link, addr) })
	}
	for _, a := range have {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || wanted[a.IPNet.String()] {
			continue
		}
		c := Change{OpDelete, Object{Kind: KindAddress, Desc: a.IPNet.String() + " dev " + s.name}}
		_ = rc.do(c, func() error { return ignoreGone(r.h.AddrDel(link, &a)) })
	}
}

// alias is the alias of this network's VXLAN device, cut to the kernel's
// limit (IFALIASZ 256 with the NUL).
func (r *Reconciler) alias() string {
	a := Alias(r.cfg.Network)
	if len(a) > 255 {
		a = a[:255]
	}
	return a
}

// ownVTEP looks up the device named for this network's VNI and says whose
// it is: an error wrapping ErrConflict when it carries another network's
// alias (two networks with one VNI would also share it on the wire, so
// each network needs its own); nil link when there is none. A device
// without an alias was made by Village before devices carried one: a
// network with a VXLAN device takes it over, no other network removes it.
func (r *Reconciler) ownVTEP() (link netlink.Link, mine bool, err error) {
	link, err = r.h.LinkByName(r.Device())
	if err != nil {
		if linkNotFound(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("looking up device %s: %w", r.Device(), err)
	}
	switch alias := link.Attrs().Alias; alias {
	case r.alias():
		return link, true, nil
	case "":
		return link, false, nil
	default:
		return link, false, fmt.Errorf("device %s (vni %d) belongs to another network (alias %q); give network %q its own vni: %w",
			r.Device(), r.cfg.VNI, alias, r.cfg.Network, ErrConflict)
	}
}

// removeVTEP deletes this network's device (and with it every neighbour,
// FDB entry and route on it) when present. Another network's device, or
// one without an owner, stays.
func (r *Reconciler) removeVTEP(rc *recorder) {
	link, mine, err := r.ownVTEP()
	if link == nil || !mine {
		if err != nil && !errors.Is(err, ErrConflict) {
			_ = rc.fail(Change{OpDelete, Object{Kind: KindDevice, Desc: r.Device()}}, err)
		}
		return
	}
	c := Change{OpDelete, Object{Kind: KindDevice, Desc: r.Device()}}
	_ = rc.do(c, func() error { return ignoreGone(r.h.LinkDel(link)) })
}

func linkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
