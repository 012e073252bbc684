package village

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
)

// Del is the CNI DEL verb. It succeeds when the namespace, the interface or
// the allocation is already gone, and is safe to repeat. It removes what it
// can even after an error and reports every failure.
func Del(args *skel.CmdArgs) error {
	conf, err := netconf.Parse(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	var errs []error
	if err := deleteLinks(args); err != nil {
		errs = append(errs, err)
	}
	if conf.HasIPAM {
		ctx, cancel := ipamTimeout()
		defer cancel()
		call := ipamCall{Type: conf.IPAMType, Args: args, IfName: args.IfName, Conf: args.StdinData}
		if err := call.Del(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteLinks removes the pod's veth. Deleting the pod end takes the host
// end with it; the host end is also removed by name for the case where the
// pod end is gone or was moved.
func deleteLinks(args *skel.CmdArgs) error {
	if args.Netns != "" {
		pod, err := netsetup.OpenPod(args.Netns)
		switch {
		case err == nil:
			defer pod.Close()
			if err := pod.DeleteLink(args.IfName); err != nil {
				return err
			}
		case errors.Is(err, netsetup.ErrHostNetNS):
			return invalidNetNS(err.Error(), nil)
		case isGone(err):
			// The runtime already removed the namespace: nothing inside to do.
		default:
			return fmt.Errorf("DEL: %w", err)
		}
	}
	return netsetup.DeleteHostLink(netsetup.HostVethName(args.ContainerID, args.IfName))
}

func isGone(err error) bool {
	var notExist ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	return errors.As(err, &notExist) || errors.As(err, &notNS)
}

// Status is the CNI STATUS verb: ready when the IPAM plugin is.
func Status(args *skel.CmdArgs) error {
	conf, err := netconf.Parse(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if !conf.HasIPAM {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipamDeadline)
	defer cancel()
	return ipamCall{Type: conf.IPAMType, Args: args, IfName: args.IfName, Conf: args.StdinData}.Status(ctx)
}

// GC is the CNI GC verb: forwarded to the IPAM plugin, which releases every
// allocation the runtime no longer lists (the reference bridge forgets this).
// The veths of deleted pods went away with their namespaces.
func GC(args *skel.CmdArgs) error {
	conf, err := netconf.Parse(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if !conf.HasIPAM {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipamDeadline)
	defer cancel()
	return ipamCall{Type: conf.IPAMType, Args: args, IfName: args.IfName, Conf: args.StdinData}.GC(ctx)
}
