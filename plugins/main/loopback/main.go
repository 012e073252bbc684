// Command loopback brings up `lo` in a pod (see pkg/loopback).
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/loopback"
)

func main() {
	skel.PluginMainFuncs(cnilog.Wrap("loopback", loopback.Funcs()), version.All, buildinfo.About("loopback"))
}
