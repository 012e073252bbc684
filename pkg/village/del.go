package village

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/village-cni/village/pkg/masq"
	"github.com/village-cni/village/pkg/netconf"
	"github.com/village-cni/village/pkg/netsetup"
)

// Del is the CNI DEL verb. It succeeds when the namespace, the interface or
// the allocation is already gone, and is safe to repeat. It removes what it
// can even after an error and reports every failure.
func Del(args *skel.CmdArgs) error {
	conf, calls, err := load(args)
	if err != nil {
		return err
	}
	// The links and the addresses go at the same time: removing a veth
	// waits in the kernel for an RCU grace period (most of a DEL's wall
	// time), and the IPAM plugin's exec does not depend on it. The reference
	// bridge releases the addresses first; a released address is handed out
	// again only by a later ADD.
	ctx, cancel := ipamTimeout()
	defer cancel()
	// A DHCP lease is released from the pod's LAN interface (DHCPRELEASE
	// goes out on it), so before the links go.
	calls, errs := releaseDHCP(ctx, calls)
	links := make(chan error, 1)
	go func() { links <- deleteLinks(conf, args) }()
	for _, call := range calls {
		if err := call.Del(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := <-links; err != nil {
		errs = append([]error{err}, errs...)
	}
	return errors.Join(errs...)
}

// load parses the config and lists the attachment's IPAM calls.
func load(args *skel.CmdArgs) (*netconf.NetConf, []ipamCall, error) {
	conf, err := netconf.Parse(args.StdinData, args.Args)
	if err != nil {
		return nil, nil, err
	}
	calls, err := ipamCalls(conf, args)
	if err != nil {
		return nil, nil, err
	}
	return conf, calls, nil
}

// forEachIPAM runs verb on every IPAM call of the attachment, keeps going
// after a failure and reports them all.
func forEachIPAM(args *skel.CmdArgs, verb func(ipamCall, context.Context) error) error {
	_, calls, err := load(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipamDeadline)
	defer cancel()
	var errs []error
	for _, c := range calls {
		if err := verb(c, ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return firstCoded(errs)
}

// firstCoded joins errors but keeps a CNI error code when there is one
// failure, so STATUS's 50 and GC's codes reach the runtime unchanged.
func firstCoded(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// deleteLinks removes the pod's veth and LAN interface, each only when
// Village made it for this container (its owner tag): after an ADD refused
// because another container's eth0 was there, the runtime's DEL must leave
// that eth0 alone. Deleting the pod end takes the host end with it; the host
// end (named from this attachment) is also removed by name for the case
// where the pod end is gone or was moved.
func deleteLinks(conf *netconf.NetConf, args *skel.CmdArgs) error {
	hostName := netsetup.HostVethName(args.ContainerID, args.IfName)
	if args.Netns != "" {
		pod, err := netsetup.OpenPod(args.Netns)
		switch {
		case err == nil:
			defer pod.Close()
			if lanAttached(conf) {
				if err := pod.DeleteOwnedLink(conf.LAN.IfName, args.ContainerID, ""); err != nil {
					return err
				}
			}
			if err := pod.DeleteOwnedLink(args.IfName, args.ContainerID, hostName); err != nil {
				return err
			}
		case netsetup.IsGone(err):
			// The runtime already removed the namespace: nothing inside to do.
		default:
			return netsetup.PodError(args.Netns, err) // the host's own namespace: code 8
		}
	}
	if spoofChecked(conf) {
		if err := masq.DeleteSpoofCheck(spoofCheck(conf, hostName, nil, nil)); err != nil {
			return err
		}
	}
	return netsetup.DeleteHostLink(hostName)
}

// GC is the CNI GC verb: forwarded to the IPAM plugins, which release every
// allocation the runtime no longer lists (the reference bridge forgets this).
// The veths of deleted pods went away with their namespaces.
func GC(args *skel.CmdArgs) error {
	return forEachIPAM(args, ipamCall.GC)
}
