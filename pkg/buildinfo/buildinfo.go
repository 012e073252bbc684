// Package buildinfo carries the version stamped into every Village binary at
// build time (see build_linux.sh) and the one-line "about" text a plugin prints
// when it is started without CNI_COMMAND.
package buildinfo

import (
	"fmt"
	"runtime"
)

// Version is set with -ldflags "-X github.com/village-cni/village/pkg/buildinfo.Version=...".
var Version = "dev"

// About returns the text skel prints for a plugin started by hand, e.g.
// "village v0.2.0-dev (go1.26.8 linux/amd64)".
func About(name string) string {
	return fmt.Sprintf("%s %s (%s %s/%s)", name, Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Image is the reference of the image `./build_linux.sh image` builds and
// deploy/kubernetes/daemonset.yaml runs (test/deploy checks they agree).
const Image = "ghcr.io/village-cni/village:v0.2.0-dev"
