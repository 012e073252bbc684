// Command wgcheck drives pkg/wireguard's kernel path inside the arm VMs of
// test/armvm, where Debian's kernel has the WireGuard module that the
// machines running the tests lack:
//
//	wgcheck up NAME KEYFILE PORT MTU          make or keep the kernel device; print its public key
//	wgcheck peer NAME PUBKEY ENDPOINT CIDR    make CIDR the one peer's allowed IPs at ENDPOINT
//
// A kernel device outlives the command, so each step is one process.
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/village-cni/village/pkg/wireguard"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "wgcheck:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 5 && args[0] == "up":
		priv, pub, err := wireguard.LoadOrCreateKey(args[2])
		if err != nil {
			return err
		}
		port, _ := strconv.Atoi(args[3])
		mtu, _ := strconv.Atoi(args[4])
		// Userspace never: the kernel's device or an error, and no
		// wireguard-go is linked here to fall back on.
		d, err := wireguard.Ensure(wireguard.DeviceConfig{Name: args[1], PrivateKey: priv, ListenPort: port, MTU: mtu, Userspace: wireguard.UserspaceNever})
		if err != nil {
			return err
		}
		defer d.Close()
		if d.Userspace() {
			return fmt.Errorf("%s is a userspace device", args[1])
		}
		fmt.Println(pub.String())
		return nil
	case len(args) == 5 && args[0] == "peer":
		key, err := wgtypes.ParseKey(args[2])
		if err != nil {
			return err
		}
		ep, err := net.ResolveUDPAddr("udp", args[3])
		if err != nil {
			return err
		}
		_, cidr, err := net.ParseCIDR(args[4])
		if err != nil {
			return err
		}
		d, err := wireguard.Open(args[1])
		if err != nil {
			return err
		}
		defer d.Close()
		_, err = d.SetPeers([]wireguard.Peer{{PublicKey: key, Endpoint: ep, AllowedIPs: []net.IPNet{*cidr}}})
		return err
	}
	return fmt.Errorf("usage: wgcheck up NAME KEYFILE PORT MTU | wgcheck peer NAME PUBKEY ENDPOINT CIDR")
}
