package overlay

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"strings"
)

// env is what a backend may look at to decide how a peer is reached.
type env struct {
	u      underlay
	vtep   linkRef // zero when the mode has no VXLAN device (or Status finds it missing)
	wg     linkRef // the WireGuard device under ModeWireGuard
	metric int     // the network's route metric
}

// linkRef names a link for building objects before it may exist.
type linkRef struct {
	index int
	name  string
}

// hop is everything one peer pod subnet needs: the route, and for VXLAN the
// neighbour entry for the route's gateway and the FDB entry for its MAC.
type hop struct {
	route route
	neigh *neigh
	fdb   *fdb
}

// A backend only says what reaching one pod subnet of a peer looks like
// (flannel's one-method idea); planning, diffing and applying are shared.
type backend interface {
	hop(e env, peer Node, cidr *net.IPNet) (hop, error)
}

func backendFor(m Mode) backend {
	switch m {
	case ModeHostGW:
		return hostGW{}
	case ModeVXLAN:
		return vxlanBackend{}
	case ModeAuto:
		return autoBackend{}
	case ModeWireGuard:
		return wgBackend{}
	}
	return nil
}

// hostGW: podCIDR via peerIP dev underlay.
type hostGW struct{}

func (hostGW) hop(e env, peer Node, cidr *net.IPNet) (hop, error) {
	if isV4(cidr.IP) != isV4(peer.IP) {
		return hop{}, fmt.Errorf("peer %s: host-gw cannot route %s via underlay address %s: %w", peer.Name, cidr, peer.IP, ErrFamily)
	}
	if !e.u.onLink(peer.IP) {
		return hop{}, fmt.Errorf("peer %s: underlay address %s is not on a subnet of %s: %w", peer.Name, peer.IP, e.u.name(), ErrOffSubnet)
	}
	link := linkRef{index: e.u.link.Attrs().Index, name: e.u.name()}
	return hop{route: route{peer: peer.Name, dst: cidr, gw: peer.IP, link: link}}, nil
}

// vxlanBackend: podCIDR via peerVTEP dev village.<vni> onlink, plus the
// neighbour (peerVTEP -> peer MAC) and FDB (peer MAC -> peer underlay IP).
type vxlanBackend struct{}

func (vxlanBackend) hop(e env, peer Node, cidr *net.IPNet) (hop, error) {
	if isV4(e.u.ip) != isV4(peer.IP) {
		return hop{}, fmt.Errorf("peer %s: underlay address %s cannot be reached from VXLAN local address %s: %w", peer.Name, peer.IP, e.u.ip, ErrFamily)
	}
	mac := peerMAC(peer)
	gw := vtepAddr(cidr).IP
	return hop{
		route: route{peer: peer.Name, dst: cidr, gw: gw, link: e.vtep, onlink: true},
		neigh: &neigh{peer: peer.Name, ip: gw, mac: mac, link: e.vtep},
		fdb:   &fdb{peer: peer.Name, mac: mac, dst: peer.IP, link: e.vtep},
	}, nil
}

// autoBackend: host-gw when it can work, vxlan otherwise.
type autoBackend struct{}

func (autoBackend) hop(e env, peer Node, cidr *net.IPNet) (hop, error) {
	if isV4(cidr.IP) == isV4(peer.IP) && e.u.onLink(peer.IP) {
		return hostGW{}.hop(e, peer, cidr)
	}
	return vxlanBackend{}.hop(e, peer, cidr)
}

func isV4(ip net.IP) bool { return ip.To4() != nil }

func peerMAC(n Node) net.HardwareAddr {
	if n.VtepMAC != nil {
		return n.VtepMAC
	}
	return DeriveMAC(n.IP)
}

// vtepAddr is the VTEP address for a pod subnet: its network address as a
// host prefix (flannel's convention).
func vtepAddr(cidr *net.IPNet) *net.IPNet {
	bits := len(cidr.IP) * 8
	return &net.IPNet{IP: cidr.IP, Mask: net.CIDRMask(bits, bits)}
}

// canonical is cidr with its host bits cleared and IPv4 kept in 4 bytes.
func canonical(cidr *net.IPNet) *net.IPNet {
	ip := cidr.IP.Mask(cidr.Mask)
	if ip == nil {
		return cidr
	}
	return &net.IPNet{IP: ip, Mask: cidr.Mask[len(cidr.Mask)-len(ip):]}
}

// desired is the full set of objects the peers need, keyed as the kernel
// identifies them. held keys belong to peers that could not be planned:
// whatever the kernel has there is left alone.
type desired struct {
	routes map[string]route
	neighs map[string]neigh
	fdbs   map[string]fdb
	held   map[string]bool // objKey(kind, key)
}

func objKey(k Kind, key string) string { return string(k) + "|" + key }

// planner turns (self, peers) into desired objects.
type planner struct {
	b        backend
	e        env
	self     Node
	own      map[string]bool // self's pod subnets (canonical)
	d        desired
	problems []Failure
}

func plan(b backend, e env, self Node, peers []Node) (desired, []Failure) {
	size := 2 * len(peers)
	p := &planner{b: b, e: e, self: self, d: desired{
		routes: make(map[string]route, size), neighs: make(map[string]neigh, size),
		fdbs: make(map[string]fdb, len(peers)), held: map[string]bool{},
	}}
	if b == nil {
		return p.d, nil
	}
	p.own = make(map[string]bool, len(self.PodCIDRs))
	for _, c := range self.PodCIDRs {
		p.own[canonical(c).String()] = true
	}
	// In a total order (name first) so that conflicts resolve the same way
	// whatever order the caller's list comes in.
	sorted := slices.Clone(peers)
	slices.SortFunc(sorted, comparePeers)
	seen := map[string]bool{}
	for _, peer := range sorted {
		if p.isSelf(peer) {
			continue
		}
		if err := checkPeer(peer, seen); err != nil {
			p.problem(peer, "", err)
			continue
		}
		for _, c := range peer.PodCIDRs {
			p.addCIDR(peer, canonical(c))
		}
	}
	return p.d, p.problems
}

func comparePeers(a, b Node) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	if c := bytes.Compare(a.IP.To16(), b.IP.To16()); c != 0 {
		return c
	}
	if c := bytes.Compare(a.VtepMAC, b.VtepMAC); c != 0 {
		return c
	}
	return strings.Compare(fmt.Sprint(a.PodCIDRs), fmt.Sprint(b.PodCIDRs))
}

func (p *planner) isSelf(n Node) bool {
	return (p.self.Name != "" && n.Name == p.self.Name) || (n.IP != nil && n.IP.Equal(p.e.u.ip))
}

func checkPeer(n Node, seen map[string]bool) error {
	switch {
	case n.Name == "":
		return fmt.Errorf("peer with address %s has no name: %w", n.IP, ErrConfig)
	case n.IP == nil:
		return fmt.Errorf("peer %s has no underlay address: %w", n.Name, ErrConfig)
	case seen[n.Name]:
		return fmt.Errorf("peer %s is listed twice: %w", n.Name, ErrConflict)
	}
	seen[n.Name] = true
	return nil
}

func (p *planner) addCIDR(peer Node, cidr *net.IPNet) {
	key := cidr.String() // the route's: every backend routes cidr itself
	err := p.checkCIDR(peer, cidr, key)
	var h hop
	if err == nil {
		h, err = p.b.hop(p.e, peer, cidr)
	}
	var nk, fk string
	if err == nil && h.neigh != nil {
		nk, fk = h.neigh.key(), h.fdb.key()
		err = p.checkHop(h, nk, fk)
	}
	if err != nil {
		p.problem(peer, key, err)
		p.hold(peer, cidr)
		return
	}
	h.route.metric = p.e.metric
	p.d.routes[key] = h.route
	if h.neigh != nil {
		p.d.neighs[nk] = *h.neigh
		p.d.fdbs[fk] = *h.fdb
	}
}

func (p *planner) checkCIDR(peer Node, cidr *net.IPNet, key string) error {
	if p.own[key] {
		return fmt.Errorf("peer %s claims pod subnet %s, which is this node's: %w", peer.Name, cidr, ErrConflict)
	}
	if other, ok := p.d.routes[key]; ok {
		return fmt.Errorf("peer %s claims pod subnet %s, already routed to peer %s: %w", peer.Name, cidr, other.peer, ErrConflict)
	}
	return nil
}

// checkHop rejects a hop whose neighbour or FDB entry (keys nk, fk) would
// overwrite another peer's (same VTEP address, or same VTEP MAC elsewhere).
func (p *planner) checkHop(h hop, nk, fk string) error {
	if n, ok := p.d.neighs[nk]; ok && n.peer != h.neigh.peer {
		return fmt.Errorf("peer %s: VTEP address %s is already peer %s's: %w", h.neigh.peer, h.neigh.ip, n.peer, ErrConflict)
	}
	if f, ok := p.d.fdbs[fk]; ok && f.peer != h.fdb.peer {
		return fmt.Errorf("peer %s: VTEP MAC %s is already peer %s's: %w", h.fdb.peer, h.fdb.mac, f.peer, ErrConflict)
	}
	return nil
}

func (p *planner) problem(peer Node, what string, err error) {
	desc := what
	if desc == "" {
		desc = fmt.Sprint(peer.IP)
	}
	p.problems = append(p.problems, Failure{
		Change: Change{Op: OpAdd, Object: Object{Kind: KindRoute, Desc: desc, Peer: peer.Name}},
		Err:    err,
	})
}

// hold protects whatever the kernel has for this peer subnet from deletion.
func (p *planner) hold(peer Node, cidr *net.IPNet) {
	p.d.held[objKey(KindRoute, cidr.String())] = true
	p.d.held[objKey(KindNeigh, vtepAddr(cidr).IP.String())] = true
	if peer.IP != nil || peer.VtepMAC != nil {
		p.d.held[objKey(KindFDB, peerMAC(peer).String())] = true
	}
}
