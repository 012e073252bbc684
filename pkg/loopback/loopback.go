// Package loopback implements the `loopback` plugin: it brings `lo` up in
// the pod on ADD, verifies it on CHECK, and never fails a DEL (the runtime
// may have removed the namespace already, and lo goes away with it).
package loopback

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/netsetup"
)

// Funcs are the verbs for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: add, Del: del, Check: check, Status: status, GC: gc}
}

func parse(stdin []byte) (*types.PluginConf, error) {
	conf := &types.PluginConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("failed to parse config: %v", err), "")
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(conf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("failed to parse prevResult: %v", err), "")
		}
	}
	return conf, nil
}

func openPod(path string) (*netsetup.Pod, error) {
	pod, err := netsetup.OpenPod(path)
	if errors.Is(err, netsetup.ErrHostNetNS) {
		return nil, types.NewError(types.ErrInvalidNetNS, err.Error(), "")
	}
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q is not a usable network namespace", path), err.Error())
	}
	return pod, nil
}

func add(args *skel.CmdArgs) error {
	conf, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	pod, err := openPod(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	lo, err := pod.LinkByName("lo")
	if err != nil || lo == nil {
		return fmt.Errorf("no lo in netns %q: %w", args.Netns, err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		if err := pod.Handle().LinkSetUp(lo); err != nil {
			return fmt.Errorf("failed to set lo up in netns %q: %w", args.Netns, err)
		}
	}
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if conf.PrevResult != nil {
		// Chained after another plugin: pass its result through unchanged.
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return err
		}
		result = prev
	} else {
		result.Interfaces = []*current.Interface{{Name: "lo", Mac: "00:00:00:00:00:00", Sandbox: args.Netns}}
		result.IPs = []*current.IPConfig{
			{Interface: current.Int(0), Address: net.IPNet{IP: net.ParseIP("127.0.0.1").To4(), Mask: net.CIDRMask(8, 32)}},
			{Interface: current.Int(0), Address: net.IPNet{IP: net.ParseIP("::1"), Mask: net.CIDRMask(128, 128)}},
		}
	}
	return types.PrintResult(result, conf.CNIVersion)
}

func check(args *skel.CmdArgs) error {
	if _, err := parse(args.StdinData); err != nil {
		return err
	}
	pod, err := openPod(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	lo, err := pod.LinkByName("lo")
	if err != nil || lo == nil {
		return fmt.Errorf("no lo in netns %q: %w", args.Netns, err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("lo is down in netns %q", args.Netns)
	}
	return nil
}

// del brings lo down when the namespace still exists and tolerates
// everything else: a missing or half-torn-down namespace is already deleted.
func del(args *skel.CmdArgs) error {
	if _, err := parse(args.StdinData); err != nil {
		return err
	}
	if args.Netns == "" {
		return nil
	}
	pod, err := netsetup.OpenPod(args.Netns)
	if err != nil {
		if errors.Is(err, netsetup.ErrHostNetNS) {
			return types.NewError(types.ErrInvalidNetNS, err.Error(), "")
		}
		return nil
	}
	defer pod.Close()
	if lo, err := pod.LinkByName("lo"); err == nil && lo != nil {
		_ = pod.Handle().LinkSetDown(lo)
	}
	return nil
}

func status(*skel.CmdArgs) error { return nil }
func gc(*skel.CmdArgs) error     { return nil }
