// Command village-ipam is Village's IPAM plugin: it hands out addresses from
// configured ranges and keeps them in a store (node-local files compatible
// with host-local by default; etcd through village-ipam-etcd). See
// pkg/ipam/plugin for the verbs.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/village-cni/village/pkg/buildinfo"
	"github.com/village-cni/village/pkg/cnilog"
	"github.com/village-cni/village/pkg/ipam/plugin"
)

func main() {
	skel.PluginMainFuncs(cnilog.Wrap("village-ipam", plugin.Funcs()), version.All, buildinfo.About("village-ipam"))
	// Success (skel exits by itself after printing an error): the result is
	// out. Closing stdout and stderr now tells the caller so while this
	// process exits, which for a Go process takes a few tenths of a
	// millisecond (its threads stopped, its memory unmapped) before the
	// kernel would close them; village decodes the result meanwhile and
	// still waits for the exit status.
	os.Stdout.Close()
	os.Stderr.Close()
}
