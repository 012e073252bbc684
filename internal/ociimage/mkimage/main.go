// Command mkimage writes the image the DaemonSet runs as an OCI archive:
// `./build_linux.sh image` runs it after building ./bin. The archive is the
// same bytes for the same binaries and time (see package ociimage; build_linux.sh
// passes the commit time as SOURCE_DATE_EPOCH); import it with
// `ctr -n k8s.io images import` or `podman load`.
//
// With -platforms it writes one image index holding an image per platform:
// each from <bin>/<os>-<arch>[-<variant>] (build_linux.sh -arch builds them)
// and that architecture's iptables from Debian's packages (internal/debs).
// Without, one image of this machine's platform from <bin> and the host's
// iptables (what the cluster tests load).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/village-cni/village/internal/debs"
	"github.com/village-cni/village/internal/ociimage"
	"github.com/village-cni/village/pkg/buildinfo"
)

func main() {
	o := ociimage.VillageOptions{}
	out := flag.String("o", "bin/village-image.tar", "archive to write")
	flag.StringVar(&o.Name, "name", buildinfo.Image, "image reference")
	flag.StringVar(&o.BinDir, "bin", "bin", "directory holding the built binaries")
	flag.StringVar(&o.RefDir, "ref", "", "directory holding the reference plugins the image carries (default: <bin>/ref)")
	platforms := flag.String("platforms", "", "comma-separated platforms of an image index, e.g. linux/amd64,linux/arm64,linux/arm/v7 (default: one image of this machine)")
	created := flag.Int64("created", 0, "image creation time and file mtimes, Unix seconds (default: $SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	if *created == 0 {
		if v, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
			*created = v
		}
	}
	var err error
	if *platforms != "" {
		err = index(o, strings.Split(*platforms, ","), *out, time.Unix(*created, 0))
	} else {
		var img ociimage.Image
		img, err = ociimage.Village(o)
		img.Created = time.Unix(*created, 0)
		if err == nil {
			err = ociimage.WriteFile(*out, img)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", o.Name, *out)
}

// index writes the image index of the platforms to out.
func index(base ociimage.VillageOptions, platforms []string, out string, created time.Time) error {
	var imgs []ociimage.Image
	for _, ps := range platforms {
		p, err := ociimage.ParsePlatform(ps)
		if err != nil {
			return err
		}
		arch, err := debs.Arch(p.Architecture)
		if err != nil {
			return err
		}
		o := base
		o.Platform = p
		o.BinDir = filepath.Join(base.BinDir, strings.ReplaceAll(p.String(), "/", "-"))
		o.RefDir = ""
		if o.Root, err = debs.Root(arch, ociimage.IptablesPackages...); err != nil {
			return fmt.Errorf("iptables of %s: %w", p, err)
		}
		img, err := ociimage.Village(o)
		if err != nil {
			return fmt.Errorf("image of %s: %w", p, err)
		}
		imgs = append(imgs, img)
	}
	return ociimage.WriteIndexFile(out, base.Name, created, imgs)
}
