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
	"github.com/vishvananda/netlink"

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

// withLo parses the config, opens the pod and finds its lo, then runs f.
func withLo(args *skel.CmdArgs, f func(conf *types.PluginConf, pod *netsetup.Pod, lo netlink.Link) error) error {
	conf, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	pod, err := netsetup.OpenPodCNI(args.Netns)
	if err != nil {
		return err
	}
	defer pod.Close()
	lo, err := pod.LinkByName("lo")
	if err != nil || lo == nil {
		return fmt.Errorf("no lo in netns %q: %w", args.Netns, err)
	}
	return f(conf, pod, lo)
}

func add(args *skel.CmdArgs) error {
	return withLo(args, func(conf *types.PluginConf, pod *netsetup.Pod, lo netlink.Link) error {
		if lo.Attrs().Flags&net.FlagUp == 0 {
			if err := pod.Handle().LinkSetUp(lo); err != nil {
				return fmt.Errorf("failed to set lo up in netns %q: %w", args.Netns, err)
			}
		}
		if conf.PrevResult != nil {
			// Chained after another plugin: pass its result through unchanged.
			prev, err := current.NewResultFromResult(conf.PrevResult)
			if err != nil {
				return err
			}
			return types.PrintResult(prev, conf.CNIVersion)
		}
		result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
		result.Interfaces = []*current.Interface{{Name: "lo", Mac: "00:00:00:00:00:00", Sandbox: args.Netns}}
		// Report the addresses lo really has (no ::1 when the pod has IPv6 off).
		addrs, err := netsetup.AddrList(pod.Handle(), lo, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("failed to list addresses of lo in netns %q: %w", args.Netns, err)
		}
		for _, a := range addrs {
			result.IPs = append(result.IPs, &current.IPConfig{Interface: current.Int(0), Address: *a.IPNet})
		}
		return types.PrintResult(result, conf.CNIVersion)
	})
}

func check(args *skel.CmdArgs) error {
	return withLo(args, func(_ *types.PluginConf, _ *netsetup.Pod, lo netlink.Link) error {
		if lo.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("lo is down in netns %q", args.Netns)
		}
		return nil
	})
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
			return netsetup.PodError(args.Netns, err)
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
