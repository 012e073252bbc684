// Command village-ipam-etcd is village-ipam with the etcd store built in.
// village-ipam execs it for networks whose ipam.store.type is "etcd", so
// the disk-store path stays small and fast; it can also be named directly
// as the ipam type.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/ipam/plugin"
	_ "github.com/village-cni/village/pkg/ipam/plugin/etcdbackend"
)

func main() {
	skel.PluginMainFuncs(cnilog.Wrap("village-ipam-etcd", plugin.Funcs()), version.All, buildinfo.About("village-ipam-etcd"))
}
