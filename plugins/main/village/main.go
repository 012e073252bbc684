// Command village is the Village main CNI plugin: a veth pair on a node
// bridge for every pod (see pkg/village).
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/village"
)

func main() {
	skel.PluginMainFuncs(cnilog.Wrap("village", village.Funcs()), version.All, buildinfo.About("village"))
}
