package netsetup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Pod is an open handle on a pod's network namespace. All container-side
// work goes through its netlink handle, so no OS thread has to switch
// namespaces.
type Pod struct {
	Path string
	ns   ns.NetNS
	h    *netlink.Handle
}

// OpenPod opens the namespace at path. It refuses the plugin's own namespace
// (configuring the host as a pod would break the node) and anything that is
// not a network namespace (ns.NSPathNotExistErr / ns.NSPathNotNSErr).
func OpenPod(path string) (*Pod, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, fmt.Errorf("failed to open netns %q: %w", path, err)
	}
	self, err := netns.Get()
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("failed to open the plugin's own netns: %w", err)
	}
	same := self.Equal(netns.NsHandle(n.Fd()))
	self.Close()
	if same {
		n.Close()
		return nil, ErrHostNetNS
	}
	// Only the route family: NewHandleAt without families also opens XFRM and
	// NETFILTER sockets (each a setns round trip) that nothing here uses.
	nh, err := netlink.NewHandleAt(netns.NsHandle(n.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("failed to open netlink in netns %q: %w", path, err)
	}
	return &Pod{Path: path, ns: n, h: nh}, nil
}

// NS is the pod namespace, for work that must run inside it.
func (p *Pod) NS() ns.NetNS { return p.ns }

// ErrHostNetNS is returned when CNI_NETNS names the plugin's own namespace.
var ErrHostNetNS = errors.New("CNI_NETNS is the plugin's own network namespace: refusing to configure the host as a pod")

// Close releases the namespace handle.
func (p *Pod) Close() {
	if p == nil {
		return
	}
	p.h.Close()
	p.ns.Close()
}

// Handle is the netlink handle inside the pod.
func (p *Pod) Handle() *netlink.Handle { return p.h }

// LinkByName finds a link inside the pod; (nil, nil) when it is absent.
func (p *Pod) LinkByName(name string) (netlink.Link, error) {
	l, err := netlinksafe.Handle{Handle: p.h}.LinkByName(name)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to look up %q in netns %q: %w", name, p.Path, err)
	}
	return l, nil
}

// HostVethMAC is the MAC of the host veth named name: derived from the
// name, so ADD, a retried ADD and villaged agree on it without state.
func HostVethMAC(name string) net.HardwareAddr { return DeriveMAC("village host veth " + name) }

// EnsureHostVethMAC puts HostVethMAC back on a host veth whose MAC was
// changed (by udev, or by hand).
func EnsureHostVethMAC(l netlink.Link) error {
	want := HostVethMAC(l.Attrs().Name)
	if bytes.Equal(l.Attrs().HardwareAddr, want) {
		return nil
	}
	if err := netlink.LinkSetHardwareAddr(l, want); err != nil {
		return fmt.Errorf("failed to set MAC %s on %q: %w", want, l.Attrs().Name, err)
	}
	l.Attrs().HardwareAddr = want
	return nil
}

// HostVethName is the node-side name of a pod's veth: "veth" and 8 hex
// digits derived from the attachment, so DEL and a retried ADD find the same
// link without any state file.
func HostVethName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return "veth" + hex.EncodeToString(sum[:4])
}

// ownerAlias tags the pod end of a veth with the container that owns it, so
// a repeated ADD can tell its own interface from a stranger's.
func ownerAlias(containerID string) string {
	if len(containerID) > 200 {
		sum := sha256.Sum256([]byte(containerID))
		containerID = "#" + hex.EncodeToString(sum[:])
	}
	return ownerAliasPrefix + containerID
}

const ownerAliasPrefix = "village/"

// Veth is the pair that connects a pod to the bridge.
type Veth struct {
	ContainerID string
	IfName      string // inside the pod
	Pod         *Pod
	Bridge      netlink.Link
	MTU         int
	MAC         net.HardwareAddr // nil: kernel-chosen
	Hairpin     bool
	Vlan        int
	// PreserveDefaultVlan keeps VLAN 1 on a port Vlan puts elsewhere.
	PreserveDefaultVlan bool
	// Isolated sets the bridge port's isolated flag (portIsolation).
	Isolated bool
}

// VethLinks is what EnsureVeth made or found.
type VethLinks struct {
	Host, Pod netlink.Link
	Created   bool // false when a repeated ADD found its own pair
}

// EnsureVeth creates the pair (the pod end named v.IfName directly inside the
// pod, the host end attached to the bridge, both up), or returns the pair a
// previous ADD for the same container made. An interface of that name that
// belongs to someone else is an error.
//
// The pod end comes up before it has addresses, as the reference bridge
// plugin's does: the kernel's work of bringing a link up (IPv6 link-local
// address and its DAD, multicast joins) then runs while the IPAM plugin
// claims the addresses, instead of after them (docs/performance.md,
// "Figures behind code comments", has the measurement).
func EnsureVeth(v Veth) (*VethLinks, error) {
	hostName := HostVethName(v.ContainerID, v.IfName)
	existing, err := v.Pod.LinkByName(v.IfName)
	if err != nil {
		return nil, err
	}
	if existing != nil {
		return v.adopt(existing, hostName)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostName
	attrs.MTU = v.MTU
	attrs.MasterIndex = v.Bridge.Attrs().Index
	attrs.Flags = net.FlagUp
	// A MAC given at creation is one the kernel marks as set, which udev's
	// MACAddressPolicy=persistent leaves alone (it rewrites random ones).
	attrs.HardwareAddr = HostVethMAC(hostName)
	veth := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         v.IfName,
		PeerNamespace:    netlink.NsFd(int(v.Pod.ns.Fd())),
		PeerHardwareAddr: v.MAC,
	}
	if v.MTU > 0 {
		veth.PeerMTU = uint32(v.MTU)
	}
	err = netlink.LinkAdd(veth)
	if errors.Is(err, syscall.EEXIST) {
		// The pod has no such interface (looked up above), so the name taken
		// is the host end's: debris of an interrupted ADD whose pod end was
		// moved or renamed. The name is derived from this attachment, so it
		// is ours: remove it and try once more. Looking only on EEXIST keeps
		// the common ADD free of the extra lookup.
		if stale, lerr := netlinksafe.LinkByName(hostName); lerr == nil {
			if derr := netlink.LinkDel(stale); derr != nil && !IsNotFound(derr) {
				return nil, fmt.Errorf("failed to remove stale host veth %q: %w", hostName, derr)
			}
			err = netlink.LinkAdd(veth)
		}
	}
	if err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return nil, fmt.Errorf("failed to create veth %q for %q in netns %q: a link of that name already exists: %w", hostName, v.IfName, v.Pod.Path, err)
		}
		return nil, fmt.Errorf("failed to create veth pair %q <-> %q in netns %q: %w", hostName, v.IfName, v.Pod.Path, err)
	}
	links := &VethLinks{Created: true}
	if links.Host, err = netlinksafe.LinkByName(hostName); err != nil {
		_ = netlink.LinkDel(veth)
		return nil, fmt.Errorf("failed to read back host veth %q: %w", hostName, err)
	}
	if err := v.finish(links); err != nil {
		_ = netlink.LinkDel(links.Host)
		return nil, err
	}
	return links, nil
}

// adopt accepts an existing pod interface when a previous ADD of this very
// container made it.
//
// An untagged veth is ours too when its peer is the host end with this
// attachment's name: an ADD killed between creating the pair and tagging it
// leaves exactly that, and the retried ADD must not refuse it forever.
func (v Veth) adopt(l netlink.Link, hostName string) (*VethLinks, error) {
	foreign := fmt.Errorf("interface %q already exists in netns %q and was not made for container %q: choose another CNI_IFNAME or remove it", v.IfName, v.Pod.Path, v.ContainerID)
	if _, ok := l.(*netlink.Veth); !ok {
		return nil, foreign
	}
	tagged := l.Attrs().Alias == ownerAlias(v.ContainerID)
	if !tagged && l.Attrs().Alias != "" {
		return nil, foreign
	}
	host, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		if !tagged {
			return nil, foreign
		}
		return nil, fmt.Errorf("pod interface %q exists but its host end %q does not: %w", v.IfName, hostName, err)
	}
	links := &VethLinks{Host: host, Pod: l}
	if !tagged {
		if host.Attrs().ParentIndex != l.Attrs().Index || l.Attrs().ParentIndex != host.Attrs().Index {
			return nil, foreign
		}
		links.Pod = nil // finish tags it
	}
	return links, v.finish(links)
}

// finish sets what creation could not: the owner tag, hairpin, VLAN, the
// pod end up, and (for an adopted pair) the bridge attachment.
func (v Veth) finish(links *VethLinks) error {
	hostName := links.Host.Attrs().Name
	if links.Host.Attrs().MasterIndex != v.Bridge.Attrs().Index {
		if err := netlink.LinkSetMasterByIndex(links.Host, v.Bridge.Attrs().Index); err != nil {
			return fmt.Errorf("failed to attach %q to bridge %q: %w", hostName, v.Bridge.Attrs().Name, err)
		}
	}
	if err := EnsureHostVethMAC(links.Host); err != nil {
		return err
	}
	if links.Host.Attrs().Alias != ownerAlias(v.ContainerID) {
		// The host end says who made it, too (see MadeByVillage); the kernel
		// takes no alias when it creates a link, so it is set here.
		if err := netlink.LinkSetAlias(links.Host, ownerAlias(v.ContainerID)); err != nil {
			return fmt.Errorf("failed to tag %q: %w", hostName, err)
		}
	}
	if v.Hairpin {
		if err := netlink.LinkSetHairpin(links.Host, true); err != nil {
			return fmt.Errorf("failed to set hairpin mode on %q: %w", hostName, err)
		}
	}
	if v.Vlan > 0 {
		if err := netlink.BridgeVlanAdd(links.Host, uint16(v.Vlan), true, true, false, true); err != nil {
			return fmt.Errorf("failed to put %q in VLAN %d: %w", hostName, v.Vlan, err)
		}
		if !v.PreserveDefaultVlan && v.Vlan != 1 {
			if err := netlink.BridgeVlanDel(links.Host, 1, false, false, false, true); err != nil && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("failed to take %q out of the default VLAN 1: %w", hostName, err)
			}
		}
	}
	if v.Isolated {
		if err := netlink.LinkSetIsolated(links.Host, true); err != nil {
			return fmt.Errorf("failed to isolate bridge port %q (portIsolation): %w", hostName, err)
		}
	}
	if links.Pod == nil {
		l, err := v.Pod.LinkByName(v.IfName)
		if err != nil || l == nil {
			return fmt.Errorf("pod interface %q vanished from netns %q: %w", v.IfName, v.Pod.Path, err)
		}
		if err := v.Pod.h.LinkSetAlias(l, ownerAlias(v.ContainerID)); err != nil {
			return fmt.Errorf("failed to tag %q in netns %q: %w", v.IfName, v.Pod.Path, err)
		}
		links.Pod = l
	}
	return v.Pod.setUp(links.Pod)
}

// setUp brings the pod's link l up unless its attributes say it is, and
// records that in them.
func (p *Pod) setUp(l netlink.Link) error {
	if l.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := p.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("failed to set %q up in netns %q: %w", l.Attrs().Name, p.Path, err)
	}
	l.Attrs().Flags |= net.FlagUp
	return nil
}

// PodAddr is one address for the pod interface.
type PodAddr struct {
	Addr *net.IPNet // address with the subnet's mask
}

// PodRoute is one route inside the pod; GW nil means on-link.
type PodRoute struct {
	Dst *net.IPNet
	GW  net.IP
	MTU int
}

// PodIface is the full container-side configuration of one interface.
type PodIface struct {
	Link   netlink.Link
	Addrs  []PodAddr
	Routes []PodRoute
}

// ConfigurePod puts addresses on the pod interface (IPv6 without DAD),
// brings it up, and adds its routes. Repeats are harmless.
func (p *Pod) ConfigurePod(c PodIface) error {
	name := c.Link.Attrs().Name
	for _, a := range c.Addrs {
		addr := &netlink.Addr{IPNet: a.Addr, Flags: nodadFlag(a.Addr.IP)}
		if err := p.h.AddrAdd(c.Link, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("failed to add %s to %q in netns %q: %w", a.Addr, name, p.Path, err)
		}
	}
	if err := p.setUp(c.Link); err != nil {
		return err
	}
	for _, r := range c.Routes {
		route := &netlink.Route{LinkIndex: c.Link.Attrs().Index, Dst: r.Dst, Gw: r.GW, MTU: r.MTU}
		if r.GW == nil {
			route.Scope = netlink.SCOPE_LINK
		}
		if err := p.h.RouteAdd(route); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("failed to add route %s via %v dev %q in netns %q: %w", r.Dst, r.GW, name, p.Path, err)
		}
	}
	return nil
}

// DeleteLink removes the named link from the pod; a missing link is fine.
func (p *Pod) DeleteLink(name string) error {
	l, err := p.LinkByName(name)
	if err != nil || l == nil {
		return err
	}
	if err := p.h.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("failed to delete %q in netns %q: %w", name, p.Path, err)
	}
	return nil
}

// DeleteHostLink removes a node-side link by name; a missing link is fine.
func DeleteHostLink(name string) error {
	l, err := netlinksafe.LinkByName(name)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to look up %q: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !IsNotFound(err) && !strings.Contains(err.Error(), "no such device") {
		return fmt.Errorf("failed to delete %q: %w", name, err)
	}
	return nil
}

// TagOwner marks a pod link as made for containerID (see OwnedBy).
func (p *Pod) TagOwner(l netlink.Link, containerID string) error {
	if err := p.h.LinkSetAlias(l, ownerAlias(containerID)); err != nil {
		return fmt.Errorf("failed to tag %q in netns %q: %w", l.Attrs().Name, p.Path, err)
	}
	return nil
}

// OwnedBy reports whether a pod link was made for containerID.
func OwnedBy(l netlink.Link, containerID string) bool {
	return l.Attrs().Alias == ownerAlias(containerID)
}

// MadeByVillage reports whether a link carries Village's owner tag (for
// any container): what tells a host veth Village made from one another
// plugin (the reference bridge) made on the same bridge. Host veths made
// before host ends were tagged carry none.
func MadeByVillage(l netlink.Link) bool {
	return strings.HasPrefix(l.Attrs().Alias, ownerAliasPrefix)
}

// OwnedLink returns the pod link name when Village made it for containerID,
// nil when it is missing or someone else's. Made for containerID means
// tagged with it, or (hostName not empty) an untagged veth whose peer is the
// host end hostName: what an ADD killed before tagging leaves (see adopt).
func (p *Pod) OwnedLink(name, containerID, hostName string) (netlink.Link, error) {
	l, err := p.LinkByName(name)
	if err != nil || l == nil {
		return nil, err
	}
	if OwnedBy(l, containerID) {
		return l, nil
	}
	if _, veth := l.(*netlink.Veth); !veth || hostName == "" || l.Attrs().Alias != "" {
		return nil, nil
	}
	host, err := netlinksafe.LinkByName(hostName)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to look up %q: %w", hostName, err)
	}
	if host.Attrs().ParentIndex != l.Attrs().Index || l.Attrs().ParentIndex != host.Attrs().Index {
		return nil, nil
	}
	return l, nil
}

// DeleteOwnedLink removes the pod link name only when OwnedLink says it is
// containerID's: an interface of that name that another container (or
// anything else) made stays. Missing is fine.
func (p *Pod) DeleteOwnedLink(name, containerID, hostName string) error {
	l, err := p.OwnedLink(name, containerID, hostName)
	if err != nil || l == nil {
		return err
	}
	if err := p.h.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("failed to delete %q in netns %q: %w", name, p.Path, err)
	}
	return nil
}

// OpenPodCNI is OpenPod with its failures as CNI errors (see PodError).
func OpenPodCNI(path string) (*Pod, error) {
	pod, err := OpenPod(path)
	if err != nil {
		return nil, PodError(path, err)
	}
	return pod, nil
}

// PodError turns an OpenPod failure into a CNI error: the plugin's own
// namespace is code 8 (what skel uses), a path that is not a network
// namespace (or does not exist) code 4 naming CNI_NETNS; anything else is
// returned as it is.
func PodError(path string, err error) error {
	switch {
	case errors.Is(err, ErrHostNetNS):
		return types.NewError(types.ErrInvalidNetNS, err.Error(), "")
	case IsGone(err):
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q is not a network namespace", path), err.Error())
	default:
		return err
	}
}

// IsGone reports whether err from OpenPod says the path is no (longer a)
// network namespace: for DEL, the pod is already gone.
func IsGone(err error) bool {
	var notExist ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	return errors.As(err, &notExist) || errors.As(err, &notNS)
}
