package testenv

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// WireGuardDevice reads the WireGuard device name of a test node through
// wgctrl, as `wg show` would on that node. Test nodes that run userspace
// devices keep their UAPI sockets in a directory of their own (runDir,
// bind-mounted over /var/run/wireguard in the node's mount namespace);
// wgctrl looks in /var/run/wireguard only, so the read runs on a thread
// of its own in a private mount namespace with runDir mounted there,
// entered in netns (where a kernel device would be). The thread ends with
// the read: it never serves another goroutine.
func WireGuardDevice(t testing.TB, netns, runDir, name string) *wgtypes.Device {
	t.Helper()
	type result struct {
		d   *wgtypes.Device
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		d, err := func() (*wgtypes.Device, error) {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return nil, fmt.Errorf("making / private: %w", err)
			}
			if err := os.MkdirAll("/var/run/wireguard", 0o755); err != nil {
				return nil, err
			}
			if err := unix.Mount(runDir, "/var/run/wireguard", "", unix.MS_BIND, ""); err != nil {
				return nil, fmt.Errorf("binding %s: %w", runDir, err)
			}
			if netns != "" {
				f, err := os.Open(netns)
				if err != nil {
					return nil, err
				}
				defer f.Close()
				if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
					return nil, fmt.Errorf("entering %s: %w", netns, err)
				}
			}
			c, err := wgctrl.New()
			if err != nil {
				return nil, err
			}
			defer c.Close()
			return c.Device(name)
		}()
		res <- result{d, err}
	}()
	r := <-res
	if r.err != nil {
		t.Fatalf("reading WireGuard device %s (UAPI sockets in %s): %v", name, runDir, r.err)
	}
	return r.d
}
