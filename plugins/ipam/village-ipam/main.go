// Command village-ipam is Village's IPAM plugin: it hands out addresses from
// configured ranges and keeps them in a store (node-local files compatible
// with host-local by default; etcd through village-ipam-etcd). See
// pkg/ipam/plugin for the verbs.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/ipam/plugin"
)

func main() {
	skel.PluginMainFuncs(cnilog.Wrap("village-ipam", plugin.Funcs()), version.All, buildinfo.About("village-ipam"))
}
