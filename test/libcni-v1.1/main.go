// Command libcni-v1.1 is an old container runtime for Village's tests: it
// loads a network configuration list with libcni 1.1.2 (the version inside
// containerd 1.6/1.7, CRI-O and podman 4 of the same age) and runs one verb
// on one attachment, the way those runtimes do.
//
//	libcni-v1.1 -conf FILE -path DIR[:DIR] -cache DIR -verb add|check|del|version \
//	    -id CONTAINER -netns PATH -ifname eth0
//
// add prints the result as libcni 1.1.2 decoded it (converted to its own
// newest version, 1.0.0); version prints the cniVersion libcni 1.1.2 read
// from the list. Errors go to stderr with exit status 1.
//
// It lives in its own Go module, pinned to github.com/containernetworking/cni
// v1.1.2, so the root module's newer libcni does not replace it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
)

func main() {
	var (
		conf   = flag.String("conf", "", "network configuration list (.conflist) or single configuration (.conf)")
		path   = flag.String("path", "", "plugin directories, colon-separated (CNI_PATH)")
		cache  = flag.String("cache", "", "libcni cache directory")
		verb   = flag.String("verb", "add", "add, check, del or version")
		id     = flag.String("id", "", "container ID")
		netns  = flag.String("netns", "", "network namespace path")
		ifname = flag.String("ifname", "eth0", "interface name in the container")
	)
	flag.Parse()
	if err := run(*conf, *path, *cache, *verb, &libcni.RuntimeConf{ContainerID: *id, NetNS: *netns, IfName: *ifname}); err != nil {
		fmt.Fprintf(os.Stderr, "libcni v1.1.2 %s: %v\n", *verb, err)
		os.Exit(1)
	}
}

func load(file string) (*libcni.NetworkConfigList, error) {
	if filepath.Ext(file) == ".conflist" {
		return libcni.ConfListFromFile(file)
	}
	c, err := libcni.ConfFromFile(file)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(c)
}

func run(file, path, cache, verb string, rt *libcni.RuntimeConf) error {
	list, err := load(file)
	if err != nil {
		return err
	}
	if verb == "version" {
		fmt.Println(list.CNIVersion)
		return nil
	}
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(path), cache, nil)
	ctx := context.Background()
	switch verb {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			return fmt.Errorf("converting the result: %w", err)
		}
		return json.NewEncoder(os.Stdout).Encode(cur)
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	}
	return fmt.Errorf("unknown verb %q", verb)
}
