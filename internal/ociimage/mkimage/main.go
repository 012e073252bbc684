// Command mkimage writes the image the DaemonSet runs as an OCI archive:
// `./build_linux.sh image` runs it after building ./bin. The archive is the
// same bytes for the same binaries and time (see package ociimage; build_linux.sh
// passes the commit time as SOURCE_DATE_EPOCH); import it with
// `ctr -n k8s.io images import` or `podman load`.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/pkg/buildinfo"
)

func main() {
	o := ociimage.VillageOptions{}
	out := flag.String("o", "bin/village-image.tar", "archive to write")
	flag.StringVar(&o.Name, "name", buildinfo.Image, "image reference")
	flag.StringVar(&o.BinDir, "bin", "bin", "directory holding the built binaries")
	flag.StringVar(&o.RefDir, "ref", "", "directory holding the reference plugins the image carries (default: <bin>/ref)")
	created := flag.Int64("created", 0, "image creation time and file mtimes, Unix seconds (default: $SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	if *created == 0 {
		if v, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
			*created = v
		}
	}
	img, err := ociimage.Village(o)
	img.Created = time.Unix(*created, 0)
	if err == nil {
		err = ociimage.WriteFile(*out, img)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", o.Name, *out)
}
