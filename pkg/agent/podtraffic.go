package agent

import (
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/village-cni/village/pkg/metrics"
)

// Traffic per pod, for the metrics (village_pod_*_total): each pod's host
// veth on the network's bridge keeps the kernel's own byte and packet
// counters, read at scrape time with one link dump, so the datapath does no
// work for them. A port is named by the pod behind it:
//
//   - the port's addresses come from the network's disk store (each record
//     names the attachment, whose host veth name Village derives), or, for a
//     veth another plugin made, from the pod end found in its namespace;
//   - an address is named by the Pod objects of this node that hold it in
//     status.podIPs, from the agent's own Pod cache (what kubelet reported,
//     not an annotation a user can write). Finished pods keep their
//     addresses in their status, so they are left out; an address two live
//     Pod objects claim names neither, and a port whose addresses name no
//     pod, or two, is left out: a wrong name is worse than none.

// podTrafficReader reads the traffic of the pods in pods (a Pod informer's
// cache: this node's pods, or all of them).
func (c *Conf) podTrafficReader(pods cache.SharedIndexInformer) metrics.PodReader {
	return func() ([]metrics.PodTraffic, error) {
		if !pods.HasSynced() {
			return nil, nil
		}
		var objs []*corev1.Pod
		for _, o := range pods.GetStore().List() {
			if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName == c.Node {
				objs = append(objs, p)
			}
		}
		return c.podTraffic(podsByAddr(objs))
	}
}

// podsByAddr names each pod address of pods by its "namespace/name"; an
// address more than one live pod claims maps to "" (ambiguous: named by
// neither). Host-network pods hold the node's addresses, and finished pods
// may hold addresses given to others since: both are left out.
func podsByAddr(pods []*corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		name := p.Namespace + "/" + p.Name
		for _, ip := range p.Status.PodIPs {
			if prev, ok := out[ip.IP]; ok && prev != name {
				out[ip.IP] = ""
				continue
			}
			out[ip.IP] = name
		}
	}
	return out
}

// podTraffic reads the counters of the network's bridge ports and names
// each by the pod behind it (byAddr, as podsByAddr makes it).
func (c *Conf) podTraffic(byAddr map[string]string) ([]metrics.PodTraffic, error) {
	ports, err := c.bridgePorts()
	if err != nil || len(ports) == 0 {
		return nil, err
	}
	addrs := map[string][]string{} // host veth -> pod addresses
	allocs, err := c.allocations(everyAddress)
	if err != nil {
		return nil, fmt.Errorf("reading the addresses of network %s: %w", c.Net.Name, err)
	}
	for _, al := range allocs {
		addrs[al.veth] = append(addrs[al.veth], al.ip)
	}
	var others []netlink.Link // veths no record accounts for: another plugin's
	for _, p := range ports {
		if _, ok := addrs[p.Attrs().Name]; !ok {
			others = append(others, p)
		}
	}
	if len(others) > 0 {
		behind := addrsBehind(others)
		for _, p := range others {
			addrs[p.Attrs().Name] = behind.of(p.Attrs().Name)
		}
	}
	var out []metrics.PodTraffic
	for _, p := range ports {
		name := ""
		for _, ip := range addrs[p.Attrs().Name] {
			n, ok := byAddr[ip]
			switch {
			case !ok:
			case n == "" || (name != "" && n != name):
				name = "-" // ambiguous: named by none
			case name == "":
				name = n
			}
		}
		st := p.Attrs().Statistics
		if name == "" || name == "-" || st == nil {
			continue
		}
		ns, pod, _ := strings.Cut(name, "/")
		// The host end's transmit is what the pod received.
		out = append(out, metrics.PodTraffic{Namespace: ns, Pod: pod,
			RxBytes: st.TxBytes, TxBytes: st.RxBytes, RxPackets: st.TxPackets, TxPackets: st.RxPackets})
	}
	return out, nil
}

// everyAddress is every IPv4 and IPv6 address, as a podCIDRs filter.
var everyAddress = []*net.IPNet{
	{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
	{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
}
