// Command mkimage writes the image the DaemonSet runs as an OCI archive:
// `./build_linux.sh image` runs it after building ./bin. The archive is the
// same bytes for the same binaries (see package ociimage); import it with
// `ctr -n k8s.io images import` or `podman load`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/pkg/buildinfo"
)

func main() {
	o := ociimage.VillageOptions{}
	out := flag.String("o", "bin/village-image.tar", "archive to write")
	flag.StringVar(&o.Name, "name", buildinfo.Image, "image reference")
	flag.StringVar(&o.BinDir, "bin", "bin", "directory holding the built binaries")
	flag.Parse()
	img, err := ociimage.Village(o)
	if err == nil {
		err = ociimage.WriteFile(*out, img)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", o.Name, *out)
}
