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
// makes it up, and its UDP port bound, at once).
func (d *Device) Up() error { return d.dev.Up() }

// Close stops serving the UAPI socket and stops the device: the TUN
// closes and the kernel removes the interface and its routes.
func (d *Device) Close() {
	_ = d.uapi.Close() // removes the socket file
	<-d.done
	d.dev.Close()
	_ = os.Remove(fmt.Sprintf("/var/run/wireguard/%s.sock", d.name))
}
