// Package userspace runs wireguard-go, the userspace WireGuard, inside
// this process on a TUN device, and serves its UAPI socket
// (/var/run/wireguard/<name>.sock) as the wireguard-go command does, so
// that wgctrl (pkg/wireguard) and the wg tool configure and read it like
// a kernel device. It is the heavy part of WireGuard support and the only
// one that links wireguard-go: villaged hands Start to pkg/wireguard,
// while the CNI plugin, which only reads a device, links none of it.
//
// wireguard-go opens its UDP sockets (and the TUN's netlink and ioctl
// sockets) from its own goroutines, on whatever OS thread they run: they
// land in that thread's network namespace. A device is therefore only
// correct in a process whose every thread is in the namespace the device
// lives in, as villaged is on its node; Start does not switch namespaces,
// and tests run each node as its own process.
package userspace

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
)

// Device is a wireguard-go device this process runs.
type Device struct {
	name string
	dev  *device.Device
	uapi net.Listener
	done chan struct{} // closed when the UAPI accept loop ends
	// cleared is the port and the descriptors whose DF fragmentable last
	// cleared: while they still hold that port with DF clear, Up looks no
	// further (wireguard-go rebinds, closing them, only when it comes up
	// again or its port changes).
	cleared struct {
		port int
		fds  []int
	}
}

// Start makes a TUN device called name with mtu, runs wireguard-go on it
// and serves its UAPI socket. logf receives wireguard-go's error lines
// (nil drops them). The device has no key, port or peers yet: those come
// through the UAPI socket. It returns the *Device as the interface
// pkg/wireguard.Userspace is an alias of, so that Start itself is a
// pkg/wireguard.StartUserspace and neither package imports the other.
func Start(name string, mtu int, logf func(format string, args ...any)) (interface {
	Up() error
	Close()
}, error) {
	tdev, err := tun.CreateTUN(name, mtu)
	if err != nil {
		return nil, fmt.Errorf("wireguard: making TUN device %s: %w", name, err)
	}
	logger := &device.Logger{
		Verbosef: device.DiscardLogf,
		Errorf: func(format string, args ...any) {
			if logf != nil {
				logf("wireguard-go %s: "+format, append([]any{name}, args...)...)
			}
		},
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), logger) // owns tdev from here
	f, err := ipc.UAPIOpen(name)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("wireguard: opening the UAPI socket of %s: %w", name, err)
	}
	l, err := ipc.UAPIListen(name, f)
	if err != nil {
		f.Close()
		dev.Close()
		return nil, fmt.Errorf("wireguard: listening on the UAPI socket of %s: %w", name, err)
	}
	d := &Device{name: name, dev: dev, uapi: l, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go dev.IpcHandle(c)
		}
	}()
	return d, nil
}

// Up brings wireguard-go up (it also comes up on the TUN's up event; this
// makes it up, and its UDP port bound, at once) and lets its IPv4 packets
// be fragmented on the path (see fragmentable). Called on every pass, it
// costs a few getsockopt calls while the sockets it last cleared are still
// bound and clear; only a new socket (the device made, brought up again,
// or given another port) makes it read the device's configuration and
// look through the process's descriptors again.
func (d *Device) Up() error {
	if err := d.dev.Up(); err != nil {
		return err
	}
	if d.cleared.port != 0 && stillClear(d.cleared.fds, d.cleared.port) {
		return nil
	}
	port := d.listenPort()
	fds, err := fragmentable(port)
	d.cleared.port, d.cleared.fds = port, fds
	return err
}

// stillClear tells whether each of fds is still an IPv4 UDP socket bound
// to port with DF clear. A socket wireguard-go closed fails (the
// descriptor is gone or is something else now), and so does a new socket
// that reuses the number (its DF is set): only the sockets fragmentable
// cleared pass.
func stillClear(fds []int, port int) bool {
	if len(fds) == 0 {
		return false
	}
	for _, fd := range fds {
		if !udp4On(fd, port) {
			return false
		}
		if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER); err != nil || v != unix.IP_PMTUDISC_DONT {
			return false
		}
	}
	return true
}

// udp4On tells whether fd is a socket of the IPv4 family, type datagram,
// protocol UDP, bound to port.
func udp4On(fd, port int) bool {
	if dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil || dom != unix.AF_INET {
		return false
	}
	if proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || proto != unix.IPPROTO_UDP {
		return false
	}
	sa, err := unix.Getsockname(fd)
	sa4, ok := sa.(*unix.SockaddrInet4)
	return err == nil && ok && sa4.Port == port
}

// listenPort is the UDP port the device is bound to (0: none yet).
func (d *Device) listenPort() int {
	conf, err := d.dev.IpcGet()
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(conf, "\n") {
		if v, ok := strings.CutPrefix(l, "listen_port="); ok {
			p, _ := strconv.Atoi(v)
			return p
		}
	}
	return 0
}

// fragmentable clears DF on the IPv4 packets of this process's UDP
// sockets bound to port (wireguard-go's), as the kernel's WireGuard sends
// its IPv4 packets: a hop on the path with a smaller MTU than the
// underlay's then fragments a full-sized packet instead of dropping it and
// answering ICMP "fragmentation needed", which many paths drop (the packet
// would vanish, and with it every inner packet of that size). wireguard-go
// opens its sockets itself and offers no option for this, so they are
// found among the process's descriptors: a socket of the IPv4 family,
// type datagram, protocol UDP, bound to port. It returns the descriptors
// it cleared.
func fragmentable(port int) ([]int, error) {
	if port == 0 {
		return nil, nil
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("wireguard: listing this process's descriptors: %w", err)
	}
	var fds []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(l, "socket:") {
			continue
		}
		if !udp4On(fd, port) {
			continue
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT); err != nil {
			return nil, fmt.Errorf("wireguard: clearing DF on the UDP socket of port %d: %w", port, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// Close stops serving the UAPI socket and stops the device: the TUN
// closes and the kernel removes the interface and its routes.
func (d *Device) Close() {
	_ = d.uapi.Close() // removes the socket file
	<-d.done
	d.dev.Close()
	_ = os.Remove(fmt.Sprintf("/var/run/wireguard/%s.sock", d.name))
}
