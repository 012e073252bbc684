// Command village-ipam-kube is village-ipam with the kubernetes store built
// in (allocations as Leases in the Kubernetes API). village-ipam execs it
// for networks whose ipam.store.type is "kubernetes", so the disk-store path
// does not link the Kubernetes client; it can also be named directly as the
// ipam type.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/ipam/plugin"
	_ "github.com/village-cni/village/pkg/ipam/plugin/kubebackend"
)

func main() {
	skel.PluginMainFuncs(cnilog.Wrap("village-ipam-kube", plugin.Funcs()), version.All, buildinfo.About("village-ipam-kube"))
}
