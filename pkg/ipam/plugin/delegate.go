package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/village-cni/village/pkg/ipam/config"
	"github.com/village-cni/village/pkg/pluginexec"
)

// Register builds a store type into this binary. The etcd store registers
// itself only in village-ipam-etcd and the kubernetes store only in
// village-ipam-kube, so that village-ipam, which every pod on a disk-store
// node execs, does not pay for linking their clients: the etcd client adds
// megabytes of binary and milliseconds of package initialisation to every
// exec (docs/performance.md, "Figures behind code comments").
func Register(storeType string, open OpenFunc) { backends[storeType] = open }

// helpers names the binary that serves a store type this binary was built
// without; it is looked up in CNI_PATH and run with the same environment and
// config, and its output passed through.
var helpers = map[string]string{config.StoreEtcd: "village-ipam-etcd", config.StoreKubernetes: "village-ipam-kube"}

// Funcs are the verbs for skel.PluginMainFuncs: the local implementation
// when the configured store is built in, the helper binary otherwise.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    delegating("ADD", Add),
		Del:    delegating("DEL", Del),
		Check:  delegating("CHECK", Check),
		Status: delegating("STATUS", Status),
		GC:     delegating("GC", GC),
	}
}

func delegating(verb string, local func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		helper, ok := helperFor(args.StdinData)
		if !ok {
			return local(args)
		}
		return runHelper(verb, helper, args)
	}
}

// helperFor peeks at ipam.store.type; anything unparsable is left to the
// local verb, which reports it properly.
func helperFor(stdin []byte) (string, bool) {
	if !bytes.Contains(stdin, []byte(`"store"`)) {
		return "", false // the default store, without decoding stdin once more
	}
	var peek struct {
		IPAM struct {
			Store *struct {
				Type string `json:"type"`
			} `json:"store"`
		} `json:"ipam"`
	}
	if json.Unmarshal(stdin, &peek) != nil || peek.IPAM.Store == nil {
		return "", false
	}
	t := peek.IPAM.Store.Type
	if _, built := backends[t]; built {
		return "", false
	}
	h, ok := helpers[t]
	return h, ok
}

func runHelper(verb, helper string, args *skel.CmdArgs) error {
	path, err := pluginexec.Find(helper, args.Path)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("this store type is served by %q, which is not in CNI_PATH %q: install it next to village-ipam", helper, args.Path), err.Error())
	}
	// The helper gets this process's environment (the runtime's CNI_*
	// variables) and stdin unchanged.
	call := pluginexec.Call{Path: path, Command: verb, Stdin: args.StdinData}
	ctx := context.Background()
	if verb != "ADD" {
		_, err := call.Run(ctx)
		return err
	}
	res, err := call.Result(ctx)
	if err != nil {
		return err
	}
	return res.Print()
}
